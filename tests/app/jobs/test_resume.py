"""Nothing lost: a 30,000-character book on a server process that is killed with SIGKILL halfway
and started again on the same data dir finishes with the same segments, sample for sample, as an
uninterrupted run (eSpeak NG speaks a text the same every time: `engines.espeak_lib`), and
Whisper hears each chapter start with its title as well as it hears the raw engine say it.

Each server is a real `voxmux serve` process (python -m app.cli), so the kill is a real one: no
shutdown code runs, the store is left as the instant found it.
"""

from __future__ import annotations

import os
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

from engines.base import SynthesisRequest
from engines.espeak import EspeakEngine
from tests.app.jobs.conftest import wait_job
from tests.conftest import CACHE_DIR, decode, free_port
from tests.hearing import hear, word_error_rate

TITLES = ["Chapter one. The river", "Chapter two. The mill", "Chapter three. The storm",
          "Chapter four. The bridge", "Chapter five. The sea"]
SENTENCES = ["The water moved slowly under the old stone arches.",
             "A miller counted his sacks of flour before the sun was up.",
             "Nobody in the village remembered a winter as long as this one.",
             "Children ran along the bank with sticks and paper boats.",
             "At night the wheel turned on in the dark, steady as a clock."]


def book() -> str:
    chapters = []
    for n, title in enumerate(TITLES):
        body, k = [], n
        while sum(len(s) + 1 for s in body) < 6000:
            body.append(SENTENCES[k % len(SENTENCES)])
            k += 1
            if len(body) % 6 == 0:
                body.append("\n\n")
        chapters.append(f"# {title}\n\n" + " ".join(body))
    return "\n\n".join(chapters)


BOOK = book()


@contextmanager
def server(data_dir: Path, file_limit: int | None = None, **settings: str
           ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`voxmux serve` on eSpeak NG and `data_dir`; `file_limit`: no file it writes may grow past
    that many bytes (RLIMIT_FSIZE: a write past it fails with EFBIG, as on a full disk)."""
    port = free_port()
    env = {**os.environ, "VOXMUX_PRELOAD": "espeak", "VOXMUX_DATA_DIR": str(data_dir),
           "VOXMUX_CACHE_DIR": str(CACHE_DIR), "VOXMUX_MODELS_DIR": str(data_dir / "models"),
           "VOXMUX_PORT": str(port), "VOXMUX_LOG_LEVEL": "warning",
           **{f"VOXMUX_{k.upper()}": v for k, v in settings.items()}}

    def limit_files() -> None:
        if file_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, file_limit))

    process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=limit_files)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).json()["status"] != "loading":
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


def stored(data_dir: Path, job_id: str) -> list[tuple[str, bytes]]:
    with sqlite3.connect(data_dir / "jobs.sqlite3") as db:
        rows = db.execute("SELECT seq, text FROM segments WHERE job = ? ORDER BY seq",
                          (job_id,)).fetchall()
    return [(text, (data_dir / "jobs" / job_id / f"{seq:07d}.pcm").read_bytes())
            for seq, text in rows]


def run_whole(data_dir: Path) -> str:
    with server(data_dir) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        job = client.post("/v1/audio/jobs", json={
            "model": "espeak", "voice": "en-us", "input": BOOK, "input_format": "markdown",
            "response_format": "wav"}).json()
        assert wait_job(client, job["id"], timeout=120)["status"] == "done"
        return str(job["id"])


def test_a_job_killed_halfway_resumes_and_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    assert len(BOOK) >= 30_000
    reference = stored(tmp_path / "whole", run_whole(tmp_path / "whole"))

    cut = tmp_path / "cut"
    with server(cut) as (url, process), httpx.Client(base_url=url, timeout=60) as client:
        job = client.post("/v1/audio/jobs", json={
            "model": "espeak", "voice": "en-us", "input": BOOK, "input_format": "markdown",
            "response_format": "wav"}).json()
        total = job["progress"]["total"]
        while client.get(f"/v1/audio/jobs/{job['id']}").json()["progress"]["done"] < total // 2:
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with sqlite3.connect(cut / "jobs.sqlite3") as db:
        done_at_kill, = db.execute("SELECT COUNT(samples) FROM segments").fetchone()
    assert total // 2 <= done_at_kill < total, (done_at_kill, total)

    with server(cut) as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        finished = wait_job(client, job["id"], timeout=120)
        assert finished["status"] == "done", finished
        resumed = stored(cut, job["id"])
        assert [t for t, _ in resumed] == [t for t, _ in reference]
        assert [a for _, a in resumed] == [a for _, a in reference]  # sample for sample
        chapters = finished["chapters"]
        assert [c["title"] for c in chapters] == TITLES
        heard_starts = [client.get(c["audio"]).content for c in chapters]

    # Heard in the same context both ways: the chapter's first six seconds as served, and the
    # raw engine saying the same words; the title's words are compared.
    engine = EspeakEngine()
    engine.load()
    for title, wav in zip(TITLES, heard_starts, strict=True):
        audio = decode(wav, "wav")
        opening = BOOK[BOOK.index(title):][:120].replace("# ", "").replace(title, title + ".")
        raw = engine.synthesize(SynthesisRequest(text=opening, voice="en-us"))
        words = len(title.split())
        raw_heard = hear(raw[:6 * engine.sample_rate], engine.sample_rate).text
        raw_wer = word_error_rate(title, " ".join(raw_heard.split()[:words]))
        heard = hear(np.asarray(audio.samples[:6 * audio.sample_rate]), audio.sample_rate).text
        served_wer = word_error_rate(title, " ".join(heard.split()[:words]))
        assert served_wer <= raw_wer + 0.1, (title, heard, raw_heard)
