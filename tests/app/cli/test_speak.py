"""`voxmux say` and `voxmux voices`, run as a user runs them (a real subprocess, no server):
the file's format follows its suffix, decodes with PyAV at the model's rate and is heard right
by Whisper; SSML and stdin work as on the API; `voices` lists every model of the catalogue;
bad input is one line on stderr and exit status 2, never a traceback. The files `say` writes
are heard in one Whisper pass (`hear_many`), each checked by its own test."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.serving.catalogue import Catalogue
from app.settings import Settings
from tests.conftest import CACHE_DIR, Decoded, decode
from tests.hearing import Heard, hear_many, word_error_rate


def voxmux(tmp: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VOXMUX_DATA_DIR": str(tmp / "data"),
           "VOXMUX_LEXICONS_DIR": str(tmp / "lexicons"), "VOXMUX_CACHE_DIR": str(CACHE_DIR),
           "VOXMUX_CREDENTIALS_DIR": str(tmp / "credentials")}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, input=stdin,
                          capture_output=True, text=True, timeout=300, check=False)


FOX = "The quick brown fox jumps over the lazy dog."
SUFFIXES = [(".wav", "wav", "piper", 22050), (".mp3", "mp3", "piper", 22050),
            (".flac", "flac", "tts-1", 24000), (".ogg", "opus", "piper", 48000)]
SSML = '<speak>Hello there.<break time="2s"/>Goodbye now.</speak>'


@dataclass
class Said:
    folder: Path
    out: Path
    done: subprocess.CompletedProcess[str]
    audio: Decoded | None = None
    heard: Heard | None = None


@pytest.fixture(scope="module")
def said(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Said]:
    """`voxmux say` run for each suffix (the fox) and for SSML on stdin, each in a folder of its
    own; what came out decoded, and all of it heard in one Whisper pass (`hear_many`) instead
    of one a file."""
    runs: dict[str, Said] = {}
    for suffix, fmt, model, _ in SUFFIXES:
        folder = tmp_path_factory.mktemp(fmt)
        out = folder / f"fox{suffix}"
        runs[fmt] = Said(folder, out, voxmux(folder, "say", FOX, "-m", model, "-o", str(out)))
    folder = tmp_path_factory.mktemp("ssml")
    out = folder / "ssml.wav"
    runs["ssml"] = Said(folder, out, voxmux(folder, "say", "-", "-m", "piper", "-o", str(out),
                                            stdin=SSML))
    for fmt, run in runs.items():
        if run.done.returncode == 0 and run.out.exists():
            run.audio = decode(run.out.read_bytes(), "wav" if fmt == "ssml" else fmt)
    spoken = [run for run in runs.values() if run.audio is not None]
    for run, heard in zip(spoken, hear_many([(run.audio.samples, run.audio.sample_rate)
                                             for run in spoken if run.audio is not None]),
                          strict=True):
        run.heard = heard
    return runs


@pytest.mark.parametrize(("suffix", "fmt", "model", "rate"), SUFFIXES)
def test_say_writes_the_suffix_format_and_is_heard(said: dict[str, Said], suffix: str, fmt: str,
                                                    model: str, rate: int) -> None:
    run = said[fmt]
    assert run.done.returncode == 0, run.done.stderr
    assert run.out.name in run.done.stderr and not list(run.folder.glob(".*.part"))
    audio, heard = run.audio, run.heard
    assert audio is not None and heard is not None
    assert audio.sample_rate == rate
    assert 1.5 < audio.duration < 6 and audio.rms > 0.01
    # (at most two of nine words: Piper samples its noise, and Whisper tiny slips on a word)
    assert word_error_rate(FOX, heard.text) <= 0.25, heard.text


def test_say_reads_ssml_from_stdin(said: dict[str, Said]) -> None:
    run = said["ssml"]
    assert run.done.returncode == 0, run.done.stderr
    audio, heard = run.audio, run.heard
    assert audio is not None and heard is not None
    assert word_error_rate("Hello there. Goodbye now.", heard.text) <= 0.25  # no tags read
    frame = audio.sample_rate // 50  # 20 ms
    quiet = [float(np.sqrt(np.mean(audio.samples[i:i + frame] ** 2))) < 0.003
             for i in range(0, len(audio.samples) - frame, frame)]
    longest = run_length = 0
    for silent in quiet:
        run_length = run_length + 1 if silent else 0
        longest = max(longest, run_length)
    assert longest * 0.02 > 1.8  # the 2 s break, in the audio itself


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
