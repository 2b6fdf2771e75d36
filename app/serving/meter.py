"""What a speech job measures while it runs, and its one `RequestStats` when it has ended."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.serving.memory import MemoryTracker
from app.serving.tracking import CacheUse, Outcome, RequestStats
from engines.base import VoxMuxError


class Meter:
    def __init__(self, sample_rate: int, *, engine_time_only: bool,
                 clock: Callable[[], float | None] = lambda: None) -> None:
        """`engine_time_only`: the RTF counts engine time, not the whole request (streamed
        text waits on its writer between sentences). `clock`: when the request's clock started,
        if not at the job's start (streamed text: its first fragment)."""
        self.sample_rate = sample_rate
        self.started = time.perf_counter()
        self.first_audio: float | None = None
        self.samples = 0
        self.segments = 0
        self.cache: CacheUse = "miss"
        self._engine_time_only = engine_time_only
        self._clock = clock
        self._engine_s = 0.0
        self._memory: MemoryTracker | None = None

    def begin(self) -> None:
        """At the job's start (the memory sample taken then is the request's baseline)."""
        self._memory = MemoryTracker()

    def audio(self, samples: int) -> bool:
        """Count audio handed to the reader; True for the request's first audio."""
        first = self.first_audio is None
        if first:
            self.first_audio = time.perf_counter()
        self.samples += samples
        return first

    def engine_time(self, seconds: float) -> None:
        self._engine_s += seconds

    def sample_memory(self) -> None:
        """After each segment, in the engine thread: never on the event loop."""
        if self._memory is not None:
            self._memory.update()

    def stats(self, outcome: Outcome, failure: VoxMuxError | None, segments: int
              ) -> RequestStats:
        if self._memory is None:
            self.begin()
        assert self._memory is not None
        now = time.perf_counter()
        clock = self._clock() or self.started
        audio_ms = round(self.samples / self.sample_rate * 1000, 1)
        total_ms = round((now - clock) * 1000, 1)
        busy_ms = self._engine_s * 1000 if self._engine_time_only else total_ms
        error = None
        if failure is not None and outcome != "cancelled":
            error = f"{type(failure).__name__}: {failure.message}"
        return RequestStats(
            outcome=outcome,
            error=error,
            started=self.started,
            t_total_ms=total_ms,
            ttfb_ms=round((self.first_audio - clock) * 1000, 1) if self.first_audio else None,
            audio_duration_ms=audio_ms,
            rtf=round(busy_ms / audio_ms, 4) if audio_ms else None,
            segments=segments,
            cache=self.cache,
            mem=self._memory.finish(),
        )
