"""Process memory: resident set size from `/proc`, GPU memory of this PID through NVML.

NVML comes from the `nvidia-ml-py` package (module `pynvml`). Without an NVIDIA driver, or where
NVML cannot tell this process's usage, VRAM figures are `None` and `vram_measured` is false.
A request's peaks are the largest of the samples taken while it ran (start, after each segment,
end), not the kernel's high-water mark, which belongs to the whole process.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Pid = int | str
"""A process id, or "self" for this process."""


def _status_kib(field: str, pid: Pid = "self") -> int | None:
    """A `/proc/<pid>/status` field in bytes; None if the process or the field is not there."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return None


_PAGE = mmap.PAGESIZE


def rss_bytes(pid: Pid = "self") -> int | None:
    """Resident set size now (the same count as VmRSS), or None where the process or `/proc`
    is not there. Read from `/proc/<pid>/statm`, one short line: it is sampled on the event
    loop after every segment, and `status` took three times as long to read and parse."""
    try:
        fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
    except OSError:
        return None
    try:
        return int(os.read(fd, 256).split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return None
    finally:
        os.close(fd)


def children(pid: Pid = "self") -> list[int]:
    """Process ids of a process's live children, gathered from each of its threads."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found += [int(child) for child in task.read_text().split()]
        except OSError:  # the thread ended since the listing
            continue
    return found


def helpers_rss_bytes(pid: Pid = "self") -> int:
    """Resident set size of a process's children: the helper processes engines start (the
    Japanese reader), whose memory leaves with them when the engines using them unload."""
    # A child may be gone since the listing: it counts 0.
    return sum(rss_bytes(child) or 0 for child in children(pid))


def rss_peak_bytes() -> int | None:
    """The process's resident high-water mark since it started (VmHWM)."""
    return _status_kib("VmHWM")


class Nvml:
    """Lazy NVML: initialised on first use, never retried after it failed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._module: Any = None
        self._handles: list[Any] | None = None

    def _init(self) -> list[Any]:
        if self._handles is not None:
            return self._handles
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._module = pynvml
        except Exception as exc:  # no driver, no library, no device: VRAM is simply unmeasured
            log.debug("NVML unavailable: %s", exc)
            self._handles = []
        return self._handles

    @property
    def available(self) -> bool:
        with self._lock:
            return bool(self._init())

    def used_by(self, pid: int) -> int | None:
        """GPU memory held by `pid` over every device, or None where NVML cannot say."""
        with self._lock:
            handles = self._init()
            if not handles:
                return None
            nvml = self._module
            total = 0
            try:
                for handle in handles:
                    seen: set[int] = set()
                    for query in (nvml.nvmlDeviceGetComputeRunningProcesses,
                                  nvml.nvmlDeviceGetGraphicsRunningProcesses):
                        for proc in query(handle):
                            if proc.pid != pid or proc.pid in seen:
                                continue
                            seen.add(proc.pid)
                            if proc.usedGpuMemory is None:  # NVML_VALUE_NOT_AVAILABLE
                                return None
                            total += int(proc.usedGpuMemory)
            except Exception as exc:
                log.debug("NVML query failed: %s", exc)
                return None
            return total


NVML = Nvml()
"""One per process, like NVML's own initialisation."""


@dataclass(frozen=True)
class MemorySample:
    rss: int | None
    vram: int | None


def sample() -> MemorySample:
    return MemorySample(rss=rss_bytes(), vram=NVML.used_by(os.getpid()))


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


@dataclass(frozen=True)
class MemoryFigures:
    """Memory over one request, in bytes; VRAM figures are None unless NVML measured them."""

    rss_start: int | None
    rss_end: int | None
    rss_peak: int | None
    vram_start: int | None
    vram_end: int | None
    vram_peak: int | None
    vram_measured: bool


class MemoryTracker:
    """Memory over one request: a sample at start, `update()` after each segment (in the engine
    thread that made it, never on the event loop), `finish()` once at the end."""

    def __init__(self) -> None:
        self.start = sample()
        self._rss_peak = self.start.rss
        self._vram_peak = self.start.vram

    def update(self) -> MemorySample:
        now = sample()
        self._rss_peak = _max(self._rss_peak, now.rss)
        self._vram_peak = _max(self._vram_peak, now.vram)
        return now

    def finish(self) -> MemoryFigures:
        end = self.update()
        measured = self.start.vram is not None and end.vram is not None
        return MemoryFigures(
            rss_start=self.start.rss,
            rss_end=end.rss,
            rss_peak=self._rss_peak,
            vram_start=self.start.vram if measured else None,
            vram_end=end.vram if measured else None,
            vram_peak=self._vram_peak if measured else None,
            vram_measured=measured,
        )


def process_memory() -> dict[str, object]:
    """The whole process now, for `/stats`."""
    vram = NVML.used_by(os.getpid())
    return {
        "rss": rss_bytes(),
        "rss_peak": rss_peak_bytes(),
        "helpers_rss": helpers_rss_bytes(),
        "vram": vram,
        "vram_measured": vram is not None,
    }
