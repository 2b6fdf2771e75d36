"""`voxmux book`, run as a user runs it (a real subprocess): a three-chapter EPUB becomes an
M4B whose chapter markers fall within 50 ms of where each chapter's audio starts (from the job
store's own counts) and are heard there; killed with SIGKILL halfway, the same command resumes
from the segments already stored; bad input is one line and exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import av
import numpy as np
import pytest

from app.jobs.store import JobStore
from app.settings import Settings
from tests.conftest import CACHE_DIR
from tests.epubs import make_epub
from tests.hearing import hear, normalize

CHAPTERS = [("Morning", "The baker opened his shop before the sun was up. "),
            ("Noon", "The market square filled with people buying bread. "),
            ("Evening", "The lamps were lit and the town went quiet. ")]


def env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "VOXMUX_DATA_DIR": str(tmp / "data"), "VOXMUX_CACHE_DIR": str(CACHE_DIR),
            "VOXMUX_LEXICONS_DIR": str(tmp / "lexicons"), "VOXMUX_JOBS_SEGMENT_CHARS": "60",
            "VOXMUX_CREDENTIALS_DIR": str(tmp / "credentials")}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", "book", *args]


def epub(path: Path) -> Path:
    chapters = [(title, f"<p>{sentence * 4}</p>") for title, sentence in CHAPTERS]
    path.write_bytes(make_epub(chapters, title="A Day in Town", identifier="voxmux-cli-book",
                               author="Tom Teller"))
    return path


def test_a_book_is_an_m4b_and_resumes_after_a_kill(tmp_path: Path) -> None:
    source, out = epub(tmp_path / "town.epub"), tmp_path / "town.m4b"
    first = subprocess.Popen(command(str(source), "-o", str(out), "-m", "piper"),
                             env=env(tmp_path), stderr=subprocess.PIPE, text=True)
    assert first.stderr is not None
    for line in first.stderr:  # one line per finished chapter when stderr is no terminal
        if line.startswith("chapters 1/3 done"):
            first.send_signal(signal.SIGKILL)
            break
    first.wait(60)
    assert first.returncode == -signal.SIGKILL and not out.exists()
    store = JobStore(tmp_path / "data" / "cli", 1 << 30)
    (job,) = store.jobs()
    stored, total, _ = store.counts(job.id)
    store.close()
    assert 0 < stored < total
    second = subprocess.run(command(str(source), "-o", str(out), "-m", "piper"),
                            env=env(tmp_path), capture_output=True, text=True, timeout=300,
                            check=False)
    assert second.returncode == 0, second.stderr
    assert f"resuming: {stored} of {total} segments already made" in second.stderr
    store = JobStore(tmp_path / "data" / "cli", 1 << 30)
    assert [j.id for j in store.jobs()] == [job.id]  # the same job, not a new one
    summaries = store.summaries(job.id)
    store.close()
    rate = summaries[0].sample_rate
    assert rate
    pause = Settings().chapter_pause_ms / 1000
    lengths = [s.samples / rate for s in summaries]
    expected = [sum(lengths[:n]) + n * pause for n in range(3)]
    with av.open(str(out)) as container:
        marks = container.chapters()
        assert container.metadata.get("title") == "A Day in Town"
        assert container.metadata.get("artist") == "Tom Teller"
        stream = container.streams.audio[0]
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    assert [m["metadata"]["title"] for m in marks] == [t for t, _ in CHAPTERS]
    starts = [float(m["start"] * m["time_base"]) for m in marks]
    assert np.allclose(starts, expected, atol=0.05), (starts, expected)
    spoken = [set(normalize(f"{title}. {sentence}")) for title, sentence in CHAPTERS]
    for n, start in enumerate(starts):
        # What is heard right after a marker is its own chapter's opening, by the words it
        # shares with each (one word alone is too little: Whisper heard "Noon" as "No" and
        # "lamps" as "lats" once, Piper sampling its noise).
        heard = set(normalize(hear(samples[int(start * rate):int((start + 3.0) * rate)],
                                   rate).text))
        shared = [len(heard & words) for words in spoken]
        assert shared.index(max(shared)) == n and shared[n] >= 4, (n, heard, shared)


@pytest.mark.parametrize(("args", "says"), [
    (("{tmp}/missing.epub", "-o", "{tmp}/a.m4b"), "no such file"),
    (("{tmp}/text.epub", "-o", "{tmp}/a.m4b"), "not an EPUB"),
    (("{tmp}/book.md", "-o", "{tmp}/a.m4b", "-m", "piper", "-v", "nobody"), "nobody"),
    (("{tmp}/book.md", "-o", "{tmp}/a.xyz"), "a.xyz"),
    (("{tmp}/book.doc", "-o", "{tmp}/a.m4b"), "book.doc"),
    (("{tmp}/book.md", "-o", "{tmp}/a.m4b", "-s", "0"), "speed"),
    (("{tmp}/book.md", "-o", "{tmp}"), "cannot tell the format"),
    (("{tmp}/book.md", "-o", "{tmp}/dir.m4b"), "is a folder"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path: Path, args: tuple[str, ...],
                                            says: str) -> None:
    (tmp_path / "text.epub").write_text("just some text, not a zip")
    (tmp_path / "book.md").write_text("# One\n\nA chapter.\n")
    (tmp_path / "book.doc").write_text("a document")
    (tmp_path / "dir.m4b").mkdir()
    done = subprocess.run(command(*(a.format(tmp=tmp_path) for a in args)), env=env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "a.m4b").exists()
