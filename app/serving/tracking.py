"""What the server has been doing: one record per request, the requests running now, totals.

A request is known by its ticket, a random id unique across processes (a cluster's ingress
replicas send them to the same engine replicas); the client's `X-Request-ID` maps to
the tickets that carry it (clients may reuse ids). Each request has a live `RequestRecord` (its
line in `/requests`) and, once it has ended, one `RequestStats`, built once: the stats envelope,
the `/requests` row, `/stats`, Prometheus and LunaVox's stats are all read from it. Everything here
is updated from the event loop only.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

from app.serving.memory import MemoryFigures

RequestStatus = Literal[
    "queued", "loading", "running", "streaming", "done", "error", "timeout", "cancelled"
]
Outcome = Literal["done", "error", "timeout", "cancelled", "rejected"]
"""How a request ended; `rejected` (queue full, 429) shows as `error` in the log."""
CacheUse = Literal["hit", "miss", "off"]

def new_ticket() -> str:
    return f"t{uuid.uuid4().hex}"


@dataclass(frozen=True)
class RequestStats:
    """A finished request, measured once when it ended."""

    outcome: Outcome
    error: str | None
    started: float
    """`time.perf_counter()` at admission to the service."""
    t_total_ms: float
    ttfb_ms: float | None
    """Time to the first audio sample produced."""
    audio_duration_ms: float
    rtf: float | None
    """Real-time factor: time taken per second of audio (engine time only for streamed text,
    which waits on its writer between sentences)."""
    segments: int
    cache: CacheUse
    mem: MemoryFigures

    def envelope(self) -> dict[str, object]:
        """The stats envelope: `X-VoxMux-Stats`, the SSE and WebSocket `done` events."""
        return {
            "t_total_ms": self.t_total_ms,
            "ttfb_ms": self.ttfb_ms,
            "audio_duration_ms": self.audio_duration_ms,
            "rtf": self.rtf,
            "segments": self.segments,
            "cache": self.cache,
            "mem": asdict(self.mem),
        }


@dataclass(eq=False)
class RequestRecord:
    """A request's line in `/requests`, kept up to date while it runs."""

    id: str
    """The client's `X-Request-ID` (or the one VoxMux gave it)."""
    model: str
    voice: str
    chars: int
    segments: int | None
    """Planned segments; None for streamed text, whose length is not known up front."""
    ticket: str = field(default_factory=new_ticket)
    created: float = field(default_factory=time.time)
    status: RequestStatus = "queued"
    segments_done: int = 0
    stats: RequestStats | None = None

    @property
    def finished(self) -> bool:
        return self.stats is not None

    def public(self, queue_position: int | None) -> dict[str, object]:
        stats = self.stats
        return {
            "id": self.id,
            "model": self.model,
            "voice": self.voice,
            "chars": self.chars,
            "segments": self.segments if self.segments is not None else self.segments_done,
            "created": self.created,
            "status": self.status,
            "cache": stats.cache if stats else None,
            "segments_done": self.segments_done,
            "ttfb_ms": stats.ttfb_ms if stats else None,
            "t_total_ms": stats.t_total_ms if stats else None,
            "audio_duration_ms": stats.audio_duration_ms if stats else None,
            "rtf": stats.rtf if stats else None,
            "error": stats.error if stats else None,
            "queue_position": queue_position,
        }


def percentiles(values: Iterable[float], digits: int = 1) -> dict[str, float | None]:
    ordered = sorted(values)
    result: dict[str, float | None] = {}
    for name, q in (("p50", 0.50), ("p95", 0.95), ("p99", 0.99)):
        if not ordered:
            result[name] = None
            continue
        # Nearest rank: the smallest value with at least q of the sample at or below it.
        rank = max(1, math.ceil(q * len(ordered)))
        result[name] = round(ordered[rank - 1], digits)
    return result


class ServingStats:
    """Totals and percentile windows over finished requests, and the recent-request log."""

    def __init__(self, log_size: int = 100, window: int = 1000) -> None:
        self.started = time.time()
        self._clock = time.monotonic()
        self.recent: deque[RequestRecord] = deque(maxlen=log_size)
        self.counts: dict[Outcome, int] = dict.fromkeys(
            ("done", "error", "timeout", "cancelled", "rejected"), 0
        )
        self.total = 0
        self._latency: deque[float] = deque(maxlen=window)
        self._ttfb: deque[float] = deque(maxlen=window)
        self._rtf: deque[float] = deque(maxlen=window)

    @property
    def uptime(self) -> float:
        return time.monotonic() - self._clock

    def open(self, record: RequestRecord) -> RequestRecord:
        self.total += 1
        self.recent.appendleft(record)
        return record

    def close(self, record: RequestRecord, stats: RequestStats) -> None:
        record.stats = stats
        record.status = "error" if stats.outcome == "rejected" else stats.outcome
        self.counts[stats.outcome] += 1
        if stats.outcome != "done":
            return
        self._latency.append(stats.t_total_ms)
        if stats.ttfb_ms is not None:
            self._ttfb.append(stats.ttfb_ms)
        if stats.rtf is not None:
            self._rtf.append(stats.rtf)

    def requests(self, position: Callable[[RequestRecord], int | None]) -> list[dict[str, object]]:
        return [r.public(None if r.finished else position(r)) for r in self.recent]

    def snapshot(self) -> dict[str, object]:
        rtf = list(self._rtf)
        return {
            "started_at": self.started,
            "uptime_s": round(self.uptime, 1),
            "requests": {
                "total": self.total,
                "ok": self.counts["done"],
                "error": self.counts["error"],
                "cancelled": self.counts["cancelled"],
                "timeout": self.counts["timeout"],
                "rejected": self.counts["rejected"],
            },
            "latency_ms": percentiles(self._latency),
            "ttfb_ms": percentiles(self._ttfb),
            "rtf": {
                **percentiles(rtf, digits=4),
                "mean": round(sum(rtf) / len(rtf), 4) if rtf else None,
            },
        }
