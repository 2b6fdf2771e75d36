"""`voxmux say` and `voxmux voices`, run as a user runs them (a real subprocess, no server):
the file's format follows its suffix, decodes with PyAV at the model's rate and is heard right
by Whisper; SSML and stdin work as on the API; `voices` lists every model of the catalogue;
bad input is one line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.serving.catalogue import Catalogue
from app.settings import Settings
from tests.conftest import CACHE_DIR, decode
from tests.hearing import hear, word_error_rate


def voxmux(tmp: Path, *args: str, stdin: str | None = None, imports: bool = False
           ) -> subprocess.CompletedProcess[str]:
    """`voxmux ARGS` in a process of its own; `imports`: stderr lists every module it imported
    (Python's `-X importtime`)."""
    env = {**os.environ, "VOXMUX_DATA_DIR": str(tmp / "data"),
           "VOXMUX_LEXICONS_DIR": str(tmp / "lexicons"), "VOXMUX_CACHE_DIR": str(CACHE_DIR),
           "VOXMUX_CREDENTIALS_DIR": str(tmp / "credentials")}
    if imports:
        env["PYTHONPROFILEIMPORTTIME"] = "1"
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(("suffix", "fmt", "model", "rate"), [
    (".wav", "wav", "piper", 22050), (".mp3", "mp3", "piper", 22050),
    (".flac", "flac", "tts-1", 24000), (".ogg", "opus", "piper", 48000)])
def test_say_writes_the_suffix_format_and_is_heard(tmp_path: Path, suffix: str, fmt: str,
                                                    model: str, rate: int) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    out = tmp_path / f"fox{suffix}"
    done = voxmux(tmp_path, "say", text, "-m", model, "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert out.name in done.stderr and not list(tmp_path.glob(".*.part"))
    audio = decode(out.read_bytes(), fmt)
    assert audio.sample_rate == rate
    assert 1.5 < audio.duration < 6 and audio.rms > 0.01
    # (at most two of nine words: Piper samples its noise, and Whisper tiny slips on a word)
    assert word_error_rate(text, hear(audio.samples, audio.sample_rate).text) <= 0.25


def test_say_reads_ssml_from_stdin(tmp_path: Path) -> None:
    ssml = '<speak>Hello there.<break time="2s"/>Goodbye now.</speak>'
    out = tmp_path / "ssml.wav"
    done = voxmux(tmp_path, "say", "-", "-m", "piper", "-o", str(out), stdin=ssml)
    assert done.returncode == 0, done.stderr
    audio = decode(out.read_bytes(), "wav")
    heard = hear(audio.samples, audio.sample_rate)
    assert word_error_rate("Hello there. Goodbye now.", heard.text) <= 0.25  # no tags read
    frame = audio.sample_rate // 50  # 20 ms
    quiet = [float(np.sqrt(np.mean(audio.samples[i:i + frame] ** 2))) < 0.003
             for i in range(0, len(audio.samples) - frame, frame)]
    longest = run = 0
    for silent in quiet:
        run = run + 1 if silent else 0
        longest = max(longest, run)
    assert longest * 0.02 > 1.8  # the 2 s break, in the audio itself


WEB = re.compile(r"\|\s+(fastapi|starlette|uvicorn)(\.\S+)?$", re.MULTILINE)
"""A web framework's module in `-X importtime`'s list."""


def test_say_and_voices_start_without_a_web_framework(tmp_path: Path) -> None:
    """`say` and `voices` run the speech service in process: importing FastAPI, Starlette or
    uvicorn would cost each start about half a second of CPU for nothing (it crept back once,
    through the job runner's error bodies)."""
    say = voxmux(tmp_path, "say", "Hello.", "-m", "espeak", "-o", str(tmp_path / "a.wav"),
                 imports=True)
    voices = voxmux(tmp_path, "voices", imports=True)
    for done in (say, voices):
        assert done.returncode == 0 and "import time:" in done.stderr, done.stderr[-2000:]
        assert not WEB.findall(done.stderr), sorted({m[0] for m in WEB.findall(done.stderr)})
    assert decode((tmp_path / "a.wav").read_bytes(), "wav").duration > 0.3


def test_voices_lists_every_model(tmp_path: Path) -> None:
    done = voxmux(tmp_path, "voices")
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[1:] if line.strip()]
    models = set(Catalogue.load(Settings().catalogue_path).models)
    assert {row[0] for row in rows} == models
    japanese = voxmux(tmp_path, "voices", "-l", "ja")
    assert japanese.returncode == 0 and "jf_alpha" in japanese.stdout
    assert "en_US-joe-medium" not in japanese.stdout


@pytest.mark.parametrize(("args", "says"), [
    (("say", "Hello.", "-m", "piper", "-v", "nobody", "-o", "{tmp}/a.wav"), "nobody"),
    (("say", "Hello.", "-m", "nothing", "-o", "{tmp}/a.wav"), "nothing"),
    (("say", "Hello.", "-o", "{tmp}/a.xyz"), "a.xyz"),
    (("say", "Hello.", "-o", "{tmp}/missing/a.wav"), "no such folder"),
    (("say", "Hello.", "-o", "-"), "--format"),
    (("say", "   ", "-o", "{tmp}/a.wav"), "no text"),
    (("voices", "-m", "nothing"), "nothing"),
])
def test_bad_input_is_one_line_and_status_2(tmp_path: Path, args: tuple[str, ...],
                                            says: str) -> None:
    done = voxmux(tmp_path, *(a.format(tmp=tmp_path) for a in args))
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "a.wav").exists()


def test_say_writes_into_a_pipe_and_through_a_link_and_refuses_a_folder(tmp_path: Path
                                                                        ) -> None:
    """A named pipe (or a device: `-o /dev/null`) is written into, never replaced by a file
    renamed over it (it was: /dev/null became a regular file); a symbolic link is followed; a
    folder is one line and status 2 before anything is spoken."""
    import stat
    import threading

    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    done = voxmux(tmp_path, "say", "Into a pipe.", "-m", "piper", "-o", str(fifo))
    reader.join(60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode) and decode(got[0], "wav").duration > 0.5
    real, link = tmp_path / "real.wav", tmp_path / "link.wav"
    link.symlink_to(real)
    done = voxmux(tmp_path, "say", "Through a link.", "-m", "piper", "-o", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and decode(real.read_bytes(), "wav").duration > 0.5
    (tmp_path / "folder.wav").mkdir()
    done = voxmux(tmp_path, "say", "Hello.", "-m", "piper", "-o", str(tmp_path / "folder.wav"))
    assert done.returncode == 2 and "is a folder" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.glob(".*.part"))
