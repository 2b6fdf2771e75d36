"""Shared pieces of the benchmarks: texts, a VoxMux server in a subprocess, timing helpers."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from app.serving import memory

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
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Terminate a server subprocess; kill it if it has not ended 30 s later (a server stalled
    or swapping may never get to its shutdown)."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def process_server(command: list[str], probe: str, log: Path, *, cwd: Path,
                   env: dict[str, str] | None = None, timeout: float = 300) -> Iterator[Server]:
    """A peer's server in a subprocess on a free loopback port (`{port}` in `command` or in an
    `env` value is replaced by it), its output in `log`; yields once `GET probe` answers 200."""
    port = free_port()

    def fill(value: str) -> str:
        return value.replace("{port}", str(port))

    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [fill(c) for c in command], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **{k: fill(v) for k, v in (env or {}).items()}},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    if httpx.get(url + probe, timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{Path(command[0]).name} {command[1:2]} did not start; "
                                       f"see {log}")
                time.sleep(0.2)
            yield Server(url, proc.pid)
        finally:
            stop(proc)


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


def _machine_seconds() -> tuple[float, float]:
    """Busy and stolen CPU seconds of the whole machine since boot, all CPUs."""
    times = psutil.cpu_times()
    busy = times.user + times.nice + times.system + times.irq + times.softirq
    return busy, times.steal


def _own_seconds(process: psutil.Process, *, waited_for: bool = False) -> float:
    """User and system CPU seconds of one process (and of its children it has waited for)."""
    times = process.cpu_times()
    seconds = times.user + times.system
    return seconds + (times.children_user + times.children_system if waited_for else 0.0)


def _tree(pid: int) -> list[psutil.Process]:
    """A live process and every live process under it; none once it has gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a live process, its waited-for children, and every live process under it."""
    total = 0.0
    for process in _tree(pid):
        with contextlib.suppress(psutil.Error):  # gone since it was listed
            total += _own_seconds(process, waited_for=True)
    return total


class CpuByProcess:
    """CPU seconds of the processes under this one, grouped by what their command lines hold,
    since construction; and of the threads of each group's busiest process, busiest first (the
    engine's threads: the one calling onnxruntime, onnxruntime's own). A process that ended
    meanwhile is not counted."""

    def __init__(self, groups: dict[str, str]) -> None:
        """`groups`: a name for each command-line fragment; a process counts in the first group
        whose fragment its command line holds, or in `other`."""
        self._groups = groups
        self._start = self._sample()

    def _group(self, process: psutil.Process) -> str:
        command = " ".join(process.cmdline())
        return next((name for name, fragment in self._groups.items() if fragment in command),
                    "other")

    def _sample(self) -> dict[str, Any]:
        processes: dict[int, tuple[str, float]] = {}
        threads: dict[tuple[int, int], float] = {}
        for process in _tree(os.getpid())[1:]:
            with contextlib.suppress(psutil.Error), process.oneshot():
                processes[process.pid] = (self._group(process), _own_seconds(process))
                threads.update({(process.pid, t.id): t.user_time + t.system_time
                                for t in process.threads()})
        return {"processes": processes, "threads": threads}

    def seconds(self) -> dict[str, Any]:
        """`groups`: CPU seconds by group; `threads`: by group, the CPU seconds of the threads
        of its busiest process, the busiest three."""
        end = self._sample()
        groups: dict[str, float] = {}
        busiest: dict[str, tuple[float, int]] = {}
        for pid, (group, seconds) in end["processes"].items():
            spent = max(0.0, seconds - self._start["processes"].get(pid, (group, 0.0))[1])
            groups[group] = groups.get(group, 0.0) + spent
            if spent > busiest.get(group, (-1.0, 0))[0]:
                busiest[group] = (spent, pid)
        threads = {}
        for group, (_, pid) in busiest.items():
            spent = sorted((max(0.0, s - self._start["threads"].get(key, 0.0))
                            for key, s in end["threads"].items() if key[0] == pid),
                           reverse=True)
            threads[group] = [round(x, 2) for x in spent[:3]]
        return {"groups": {k: round(v, 2) for k, v in sorted(groups.items())},
                "threads": threads}


class OtherWork:
    """How much of the machine went to anything but this benchmark (its process and every
    process under it: servers, helpers, the peer) and to the hypervisor, since construction.
    The load average is no such measure: it counts the benchmark's own busy threads."""

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float, float]:
        busy, steal = _machine_seconds()
        return busy, steal, tree_cpu_seconds(os.getpid()), time.monotonic()

    def shares(self) -> dict[str, float]:
        """`others`: CPU time of other processes, `steal`: time the hypervisor gave elsewhere,
        each as a share of the machine's capacity over the interval."""
        busy0, steal0, own0, t0 = self._start
        busy1, steal1, own1, t1 = self._sample()
        capacity = max(t1 - t0, 1e-9) * (os.cpu_count() or 1)
        others = max(0.0, (busy1 - busy0) - (own1 - own0))
        return {"others": round(others / capacity, 3),
                "steal": round((steal1 - steal0) / capacity, 3)}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "platform": platform.platform(),
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}


def write_result(name: str, data: dict[str, Any], folder: Path = RESULTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    return path


@contextmanager
def timed_phase(name: str, phases: dict[str, Any]) -> Iterator[None]:
    """Run a benchmark phase: its seconds and the share of the machine other work took in
    it, into `phases[name]`."""
    print(f"== {name}", flush=True)
    started = time.perf_counter()
    other = OtherWork()
    yield
    phases[name] = {"seconds": round(time.perf_counter() - started, 1),
                    "other_work": other.shares()}
    print(f"== {name} done: {phases[name]}", flush=True)


def run_benchmark(name: str, description: str,
                  measure: Callable[[bool], dict[str, Any]],
                  summary: Callable[[dict[str, Any]], str]) -> None:
    """A benchmark's command line: `--quick` writes into bench/results/quick/; the result goes
    to `<name>.json` and its tables, rendered from that file, to `<name>.md`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="into bench/results/quick/")
    args = parser.parse_args()
    folder = RESULTS / "quick" if args.quick else RESULTS
    path = write_result(name, measure(args.quick), folder)
    (folder / f"{name}.md").write_text(summary(json.loads(path.read_text())))
    print("wrote", path, "and", folder / f"{name}.md")
