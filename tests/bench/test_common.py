"""The benchmark's count of its own CPU time, which it subtracts to find other work."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bench.common import CpuByProcess, tree_cpu_seconds

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def _burner(seconds: float, then_sleep: float = 0.0) -> str:
    return BURN.format(s=seconds) + f"time.sleep({then_sleep})\n"


def test_a_live_grandchilds_cpu_counts_as_ours() -> None:
    # The child starts a grandchild that burns 0.4 s of CPU and then waits, still running.
    grandchild = _burner(0.4, then_sleep=30)
    child = (f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {grandchild!r}])"
             "\nprint(p.pid, flush=True)\np.wait()\n")
    before = tree_cpu_seconds(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    grandchild_pid = int(proc.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while tree_cpu_seconds(grandchild_pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)  # until the grandchild has burnt its share and sleeps
        assert tree_cpu_seconds(os.getpid()) - before >= 0.4
    finally:
        os.kill(grandchild_pid, signal.SIGKILL)
        proc.wait()


def test_a_finished_childs_cpu_still_counts() -> None:
    before = tree_cpu_seconds(os.getpid())
    subprocess.run([sys.executable, "-c", _burner(0.3)], check=True)
    assert tree_cpu_seconds(os.getpid()) - before >= 0.3


def test_cpu_is_told_apart_by_command_line_and_thread() -> None:
    """A child that burns 0.4 s on one thread counts in the group its command line names; one
    that sleeps counts nothing in its own; the burner's busiest thread holds the 0.4 s."""
    marker = "# voxmux-bench-burner"
    cpu = CpuByProcess({"burner": marker, "sleeper": "# voxmux-bench-sleeper"})
    burner = subprocess.Popen([sys.executable, "-c", _burner(0.4, then_sleep=30) + marker])
    sleeper = subprocess.Popen([sys.executable, "-c",
                                "import time\ntime.sleep(30)\n# voxmux-bench-sleeper"])
    try:
        deadline = time.monotonic() + 60
        while tree_cpu_seconds(burner.pid) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        spent = cpu.seconds()
    finally:
        for proc in (burner, sleeper):
            proc.kill()
            proc.wait()
    assert 0.4 <= spent["groups"]["burner"] < 1.5, spent
    assert spent["groups"].get("sleeper", 0.0) < 0.2, spent
    assert spent["threads"]["burner"][0] >= 0.35, spent
