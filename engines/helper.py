"""A helper process: work whose memory must go back to the system when the engines using it unload.

Some readers load dictionaries and models that no Python API can free again (pyopenjtalk keeps its
Japanese dictionary and reading models for the life of the process, about 70 MB). Run in a helper
process, that memory leaves with the process. The helper is a Python module run as
`python -m <module>` that speaks JSON lines: it writes `{"ready": true}` once warmed up, then
answers each `{"op": ..., "text": ...}` with `{"ok": <result>}` or `{"error": <message>}`, and
exits when its stdin closes.

Engines `hold` the helper while they are loaded and `release` it when they unload; when the last
holder lets go the process is stopped. A call starts the process if it is not running (so a helper
that died is replaced on the next call), and one call runs at a time. A helper that does not answer
within the call timeout is killed; a failed call raises `SynthesisFailed` with the reason.
Each process has a thread that waits for it, so a helper that dies, whatever killed it, is
reaped at once rather than left a zombie until the next call.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from engines.base import SynthesisFailed

log = logging.getLogger(__name__)

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
"""Where `engines` is importable from, for a helper started from any working directory."""


class HelperProcess:
    def __init__(self, module: str, *, what: str, start_timeout: float = 120.0,
                 call_timeout: float = 60.0, command: list[str] | None = None) -> None:
        self.what = what
        """Named in errors and logs: "the Japanese reader"."""
        self._command = command or [sys.executable, "-m", module]
        self._start_timeout = start_timeout
        self._call_timeout = call_timeout
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._holders = 0
        atexit.register(self.stop)

    @property
    def pid(self) -> int | None:
        """The running helper's process id, or None when none runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def holders(self) -> int:
        return self._holders

    def hold(self, *, start: bool) -> None:
        """Count one more user; `start` starts the process now rather than on the first call."""
        with self._lock:
            self._holders += 1
            if start:
                try:
                    self._ensure_running()
                except BaseException:
                    self._holders -= 1
                    raise

    def release(self) -> None:
        """Count one user less; the last one out stops the process."""
        with self._lock:
            self._holders = max(0, self._holders - 1)
            if self._holders == 0:
                self._stop_locked()

    def call(self, op: str, text: str) -> Any:
        with self._lock:
            process = self._ensure_running()
            assert process.stdin is not None
            try:
                process.stdin.write(json.dumps({"op": op, "text": text}).encode() + b"\n")
                process.stdin.flush()
                reply = self._read(process, self._call_timeout)
            except (OSError, ValueError) as exc:
                self._stop_locked(kill=True)
                raise SynthesisFailed(f"{self.what} failed: {exc}") from exc
        if "error" in reply:
            raise SynthesisFailed(f"{self.what} failed: {reply['error']}")
        return reply["ok"]

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    def _ensure_running(self) -> subprocess.Popen[bytes]:
        process = self._process
        if process is not None and process.poll() is None:
            return process
        if process is not None:
            log.warning("%s exited with status %s; starting it again", self.what,
                        process.returncode)
        started = time.monotonic()
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(filter(None, [_PACKAGE_ROOT,
                                                           os.environ.get("PYTHONPATH")]))}
        # Its own session: a Ctrl+C in the terminal reaches the server, which stops it in order.
        process = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   env=env, start_new_session=True)
        self._process = process
        threading.Thread(target=self._reap, args=(process,), name=f"reap-{process.pid}",
                         daemon=True).start()
        try:
            ready = self._read(process, self._start_timeout)
        except (OSError, ValueError) as exc:
            self._stop_locked(kill=True)
            raise SynthesisFailed(f"{self.what} did not start: {exc}") from exc
        if not ready.get("ready"):
            self._stop_locked(kill=True)
            raise SynthesisFailed(f"{self.what} did not start: {ready.get('error', ready)}")
        log.info("%s started (pid %d) in %.2f s", self.what, process.pid,
                 time.monotonic() - started)
        return process

    def _reap(self, process: subprocess.Popen[bytes]) -> None:
        """Wait for `process` to end, so that it never stays a zombie."""
        status = process.wait()
        if self._process is process:  # not stopped by us: it died or was killed
            log.warning("%s (pid %d) exited with status %s", self.what, process.pid, status)

    def _read(self, process: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
        """The next reply line, or ValueError when the helper is silent or gone."""
        stdout: IO[bytes] | None = process.stdout
        assert stdout is not None
        readable, _, _ = select.select([stdout], [], [], timeout)
        if not readable:
            raise ValueError(f"no answer within {timeout:g} s")
        line = stdout.readline()
        if not line:
            process.wait(timeout=5)
            raise ValueError(f"the process exited with status {process.returncode}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _stop_locked(self, kill: bool = False) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if kill:
            process.kill()
        elif process.stdin is not None:
            with suppress(OSError):
                process.stdin.close()  # the helper exits at the end of its input
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
        log.info("%s stopped", self.what)


def serve(handlers: dict[str, Any], warm: dict[str, str]) -> None:
    """The helper's side: warm up with `warm` (op -> text), say ready, answer until stdin ends.

    The protocol gets the original stdout; anything the libraries print goes to stderr instead.
    """
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")

    try:
        for op, text in warm.items():
            handlers[op](text)
    except Exception as exc:
        send({"error": f"{type(exc).__name__}: {exc}"})
        return
    send({"ready": True})
    for line in sys.stdin.buffer:
        try:
            request = json.loads(line)
            send({"ok": handlers[request["op"]](request["text"])})
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}"})
