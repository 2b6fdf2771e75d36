"""Shared pieces of the benchmarks: texts, a VoxMux server in a subprocess, timing helpers."""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app import memory

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

SENTENCES = [
    "The morning train left the station exactly on time.",
    "Passengers read their papers in comfortable silence.",
    "Outside, the wide fields were covered in a thin frost.",
    "A conductor walked slowly down the narrow aisle.",
    "He checked every single ticket with great care.",
    "Near the window, a small child pointed at the hills.",
    "The pale sun rose higher over the quiet valley.",
    "Someone laughed softly at the back of the carriage.",
    "The next stop was still more than an hour away.",
    "Everyone settled in for the long and gentle ride.",
]


def sentences(n: int) -> str:
    return " ".join(SENTENCES[i % len(SENTENCES)] for i in range(n))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Server:
    """A server subprocess the benchmark started: where it answers and which process it is."""

    url: str
    pid: int

    def rss(self) -> int:
        """Resident set size of the server and its helper processes now, in bytes."""
        return (memory.rss_bytes(self.pid) or 0) + memory.helpers_rss_bytes(self.pid)


@contextmanager
def voxmux_process(env: dict[str, str] | None = None) -> Iterator[Server]:
    """`voxmux serve` in a subprocess on a free port; yields it once `/health` is past loading."""
    port = free_port()
    full_env = {**os.environ, "VOXMUX_PORT": str(port), "VOXMUX_HOST": "127.0.0.1",
                "VOXMUX_LOG_LEVEL": "warning", **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--profile", "cpu"], cwd=ROOT, env=full_env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/health", timeout=5).json()["status"] != "loading":
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("VoxMux did not start")
            time.sleep(0.2)
        yield Server(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def voxmux_server(env: dict[str, str] | None = None) -> Iterator[str]:
    """`voxmux serve` in a subprocess on a free port; yields its base URL once healthy."""
    with voxmux_process(env) as server:
        yield server.url


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {"p50": pick(0.5), "p95": pick(0.95), "p99": pick(0.99),
            "mean": statistics.fmean(ordered), "n": len(ordered)}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages: other work on the machine skews every figure."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "platform": platform.platform(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
            "load_average": load_average()}


def write_result(name: str, data: dict[str, Any], folder: Path = RESULTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    return path
