"""First audio of a normal request while other clients hold idle and unread sockets open.

Run: `.venv/bin/python -m bench.lockout [--quick]` (starts its own server; writes
bench/results/lockout.json and lockout.md). One `voxmux serve` with the cpu profile's defaults
(concurrency 1, queue 16) on Piper, cache off. The measured client asks for one sentence as
24 kHz pcm, streamed, and reads its first audio chunk; each phase repeats that and reports the
median. Phases: nothing else open; 40 text sockets (`/ws/v1/tts/text`) that sent their options
and no text, from four other clients (127.0.0.2-5, 10 each: a client's share is 16); the same 40
plus 10 sockets that sent a long text and never read (127.0.0.6), measured at once, while their
jobs render up to `VOXMUX_STREAM_BUFFER_SECONDS` of audio each (real engine work, taking turns
with the measured client), and again once they wait holding nothing. Before VoxMux admitted per
engine call, 17 idle text sockets answered every other request 429.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from bench.common import run_benchmark, sentences, timed_phase, voxmux_server

IDLE_CLIENTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
IDLE_PER_CLIENT = 10
UNREAD_CLIENT = "127.0.0.6"
UNREAD = 10


def _frame(payload: bytes) -> bytes:
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x81]) + (bytes([0x80 | size]) if size < 126
                            else bytes([0x80 | 126]) + size.to_bytes(2, "big"))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def open_socket(url: str, path: str, source: str, first: dict[str, Any]) -> socket.socket:
    """A WebSocket opened by hand from `source`, its first message sent; never read again."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                 f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                 "Sec-WebSocket-Version: 13\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"no WebSocket: {head[:40]!r}")
    sock.sendall(_frame(json.dumps(first).encode()))
    return sock


def settled(client: httpx.Client, limit: float = 120) -> float:
    """Wait until no request holds a place on any model (the unread sockets' buffers are full);
    the seconds it took."""
    started = time.perf_counter()
    while time.perf_counter() - started < limit:
        stats = client.get("/stats").json()
        if stats["active"] == 0 and stats["queued"] == 0:
            break
        time.sleep(0.2)
    return time.perf_counter() - started


@contextmanager
def hostile(url: str, idle: bool, unread: bool) -> Iterator[None]:
    socks = []
    try:
        if unread:
            socks += [open_socket(url, "/ws/v1/tts", UNREAD_CLIENT,
                                  {"model": "piper", "input": sentences(60)})
                      for _ in range(UNREAD)]
        if idle:
            socks += [open_socket(url, "/ws/v1/tts/text", client, {"model": "piper"})
                      for client in IDLE_CLIENTS for _ in range(IDLE_PER_CLIENT)]
        time.sleep(1.0)
        yield
    finally:
        for sock in socks:
            sock.close()


def first_audio(client: httpx.Client, text: str) -> tuple[float, int]:
    """Seconds to the first audio chunk, and the status."""
    started = time.perf_counter()
    with client.stream("POST", "/v1/audio/speech", json={
            "model": "piper", "input": text, "response_format": "pcm"}) as response:
        if response.status_code != 200:
            response.read()
            return time.perf_counter() - started, response.status_code
        chunks = response.iter_bytes()
        next(chunk for chunk in chunks if chunk)
        seconds = time.perf_counter() - started
        for _ in chunks:  # the rest of the answer, read as a player would
            pass
    return seconds, 200


def measure(quick: bool) -> dict[str, Any]:
    repeats = 5 if quick else 15
    phases: dict[str, Any] = {}
    rows = []
    env = {"VOXMUX_PRELOAD": "piper", "VOXMUX_CACHE_MAX_ITEMS": "0"}
    with voxmux_server(env) as url, httpx.Client(base_url=url, timeout=120) as client:
        first_audio(client, "Warm up.")
        for name, idle, unread, settle in (
                ("none", False, False, False), ("40 idle text sockets", True, False, False),
                ("40 idle + 10 unread sockets, while those fill their buffers", True, True, False),
                ("40 idle + 10 unread sockets, their buffers full", True, True, True)):
            with timed_phase(name, phases), hostile(url, idle, unread):
                if settle:
                    phases[name + " (settle s)"] = round(settled(client), 1)
                runs = [first_audio(client, f"Sentence {i} of the measured client is here.")
                        for i in range(repeats)]
            seconds = [s for s, status in runs if status == 200]
            rows.append({"open": name, "requests": repeats, "ok": len(seconds),
                         "ttfa_median_ms": round(statistics.median(seconds) * 1000, 1)
                         if seconds else None,
                         "ttfa_max_ms": round(max(seconds) * 1000, 1) if seconds else None})
            print(rows[-1], flush=True)
    return {"repeats": repeats, "phases": phases, "rows": rows}


def summary(result: dict[str, Any]) -> str:
    base = result["rows"][0]["ttfa_median_ms"]
    lines = ["| other clients hold | answered 200 | first audio, median (ms) | max (ms) | "
             "median / none |", "|---|---|---|---|---|"]
    for row in result["rows"]:
        ratio = (f"{row['ttfa_median_ms'] / base:.2f}" if base and row["ttfa_median_ms"]
                 else "-")
        lines.append(f"| {row['open']} | {row['ok']} of {row['requests']} | "
                     f"{row['ttfa_median_ms']} | {row['ttfa_max_ms']} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_benchmark("lockout", __doc__.split("\n\n")[0], measure, summary)
