"""Nothing lost: a 30,000-character book on a server process that is killed with SIGKILL halfway
and started again on the same data dir finishes with the same segments, sample for sample, as an
uninterrupted run (eSpeak NG speaks a text the same every time: `engines.espeak_lib`), and
Whisper hears each chapter start with its title as well as it hears the raw engine say it.

The killed server is a real `voxmux serve` process (python -m app.cli), so the kill is a real
one: no shutdown code runs, the store is left as the instant found it. The server that resumes
the job runs in the test's process on the same data dir, and then makes the uninterrupted run of
the same book. Whisper hears the five chapter openings in one pass each way (served and raw).
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
from tests.conftest import CACHE_DIR, decode, free_port, start_server, test_settings
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


def post_book(client: httpx.Client) -> str:
    job = client.post("/v1/audio/jobs", json={
        "model": "espeak", "voice": "en-us", "input": BOOK, "input_format": "markdown",
        "response_format": "wav"}).json()
    return str(job["id"])


def hear_openings(clips: list[tuple[np.ndarray, int]], seconds: float = 6.0,
                  gap: float = 1.5) -> list[str]:
    """What Whisper hears in the first `seconds` of each clip, in one pass over the clips joined
    with `gap` seconds of silence (each word goes to the clip its start falls in)."""
    rate = clips[0][1]
    assert all(r == rate for _, r in clips), "one rate"
    parts, offsets, at = [], [], 0
    for samples, _ in clips:
        opening = np.asarray(samples[:int(seconds * rate)], dtype=np.float32)
        offsets.append(at / rate)
        parts += [opening, np.zeros(int(gap * rate), np.float32)]
        at += len(opening) + int(gap * rate)
    heard = hear(np.concatenate(parts), rate).words
    return [" ".join(w.word for w in heard if start <= w.start < start + seconds)
            for start in offsets]


def test_a_job_killed_halfway_resumes_and_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    assert len(BOOK) >= 30_000
    cut = tmp_path / "cut"
    with server(cut) as (url, process), httpx.Client(base_url=url, timeout=60) as client:
        job_id = post_book(client)
        total = client.get(f"/v1/audio/jobs/{job_id}").json()["progress"]["total"]
        while client.get(f"/v1/audio/jobs/{job_id}").json()["progress"]["done"] < total // 2:
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    with sqlite3.connect(cut / "jobs.sqlite3") as db:
        done_at_kill, = db.execute("SELECT COUNT(samples) FROM segments").fetchone()
    assert total // 2 <= done_at_kill < total, (done_at_kill, total)

    # Started again on the same data dir, in this process (no audio cache: the uninterrupted
    # run made after the resumed one renders every segment itself).
    live = start_server(test_settings(tmp_path, preload=["espeak"], idle_ttl=-1, data_dir=cut,
                                      cache_max_items=0))
    try:
        with live.client() as client:
            finished = wait_job(client, job_id, timeout=120)
            assert finished["status"] == "done", finished
            whole = post_book(client)
            assert wait_job(client, whole, timeout=120)["status"] == "done"
            chapters = finished["chapters"]
            assert [c["title"] for c in chapters] == TITLES
            heard_starts = [client.get(c["audio"]).content for c in chapters]
    finally:
        live.stop()
    resumed, reference = stored(cut, job_id), stored(cut, whole)
    assert [t for t, _ in resumed] == [t for t, _ in reference]
    assert [a for _, a in resumed] == [a for _, a in reference]  # sample for sample

    # Heard in the same context both ways: the chapter's first six seconds as served, and the
    # raw engine saying the same words; the title's words are compared.
    engine = EspeakEngine()
    engine.load()
    raw = []
    for title in TITLES:
        opening = BOOK[BOOK.index(title):][:120].replace("# ", "").replace(title, title + ".")
        raw.append((engine.synthesize(SynthesisRequest(text=opening, voice="en-us")),
                    engine.sample_rate))
    served = [(audio.samples, audio.sample_rate)
              for audio in (decode(wav, "wav") for wav in heard_starts)]
    for title, raw_heard, heard in zip(TITLES, hear_openings(raw), hear_openings(served),
                                       strict=True):
        words = len(title.split())
        raw_wer = word_error_rate(title, " ".join(raw_heard.split()[:words]))
        served_wer = word_error_rate(title, " ".join(heard.split()[:words]))
        assert served_wer <= raw_wer + 0.1, (title, heard, raw_heard)
