"""`voxmux serve` with a log dir: the log file is private, and a generated API key is shown on
the console once, never written to a log file."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.cli.logs import LOG_FILE
from tests.conftest import CACHE_DIR, free_port

ROOT = Path(__file__).resolve().parents[3]


def serve_until_ready(tmp_path: Path, **env: str) -> tuple[str, str]:
    """Start `voxmux serve` in a process of its own, wait for /health, stop it: (stdout, stderr)."""
    port = free_port()
    environment = {**os.environ, "VOXMUX_HOST": "127.0.0.1", "VOXMUX_PORT": str(port),
                   "VOXMUX_PRELOAD": "", "VOXMUX_LOG_LEVEL": "info",
                   "VOXMUX_MODELS_DIR": str(tmp_path / "models"),
                   "VOXMUX_CACHE_DIR": str(CACHE_DIR), **env}
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=environment,
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "no server"
            time.sleep(0.2)
    finally:
        process.terminate()
        out, err = process.communicate(timeout=30)
    return out, err


def test_a_generated_key_reaches_the_console_once_and_no_log_file(tmp_path: Path) -> None:
    logs, credentials = tmp_path / "logs", tmp_path / "credentials"
    old = os.umask(0o022)  # the usual umask, which makes files 0644 unless asked otherwise
    try:
        out, err = serve_until_ready(tmp_path, VOXMUX_API_KEYS="auto",
                                     VOXMUX_LOG_DIR=str(logs),
                                     VOXMUX_CREDENTIALS_DIR=str(credentials))
    finally:
        os.umask(old)
    key = (credentials / "api_key").read_text().strip()
    log_file = logs / LOG_FILE
    written = log_file.read_text()
    assert "Application startup complete" in written  # the file does get the log
    assert key not in written
    assert stat.S_IMODE(log_file.stat().st_mode) == 0o600
    assert (out + err).count(key) == 1  # shown once, so the operator can copy it
    assert str(credentials / "api_key") in written  # the log says where the key is kept

    # Started again: the key is reused and shown nowhere.
    out, err = serve_until_ready(tmp_path, VOXMUX_API_KEYS="auto", VOXMUX_LOG_DIR=str(logs),
                                 VOXMUX_CREDENTIALS_DIR=str(credentials))
    assert key not in out + err and key not in log_file.read_text()


def test_an_existing_log_file_is_made_private(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / LOG_FILE).write_text("from an older version\n")
    (logs / LOG_FILE).chmod(0o644)
    serve_until_ready(tmp_path, VOXMUX_LOG_DIR=str(logs),
                      VOXMUX_CREDENTIALS_DIR=str(tmp_path / "credentials"))
    assert stat.S_IMODE((logs / LOG_FILE).stat().st_mode) == 0o600
