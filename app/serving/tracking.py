"""What the server has been doing: a log of recent requests, totals and latency windows.

`/requests` shows the log newest first; `/stats` shows totals and percentiles over the last
`window` finished requests. Everything here is updated from the event loop only.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Literal

RequestStatus = Literal[
    "queued", "loading", "running", "streaming", "done", "error", "timeout", "cancelled"
]
Outcome = Literal["done", "error", "timeout", "cancelled", "rejected"]
"""How a request ended; `rejected` (queue full, 429) shows as `error` in the log."""

_tickets = itertools.count(1)


@dataclass
class RequestRecord:
    id: str
    model: str
    voice: str
    chars: int
    segments: int
    created: float = field(default_factory=time.time)
    status: RequestStatus = "queued"
    cache: Literal["hit", "miss"] = "miss"
    segments_done: int = 0
    ttfb_ms: float | None = None
    t_total_ms: float | None = None
    audio_duration_ms: float | None = None
    rtf: float | None = None
    error: str | None = None
    ticket: str = field(default_factory=lambda: f"t{next(_tickets)}")
    """Internal, unique even when clients reuse request ids; the scheduler queues by it."""

    @property
    def finished(self) -> bool:
        return self.status in ("done", "error", "timeout", "cancelled")

    def public(self, queue_position: int | None) -> dict[str, object]:
        data = asdict(self)
        del data["ticket"]
        data["queue_position"] = queue_position
        return data


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

    def close(self, record: RequestRecord, outcome: Outcome, envelope: dict[str, object],
              error: str | None = None) -> None:
        record.status = "error" if outcome == "rejected" else outcome
        record.error = error
        record.ttfb_ms = _number(envelope.get("ttfb_ms"))
        record.t_total_ms = _number(envelope.get("t_total_ms"))
        record.audio_duration_ms = _number(envelope.get("audio_duration_ms"))
        record.rtf = _number(envelope.get("rtf"))
        self.counts[outcome] += 1
        if outcome != "done":
            return
        if record.t_total_ms is not None:
            self._latency.append(record.t_total_ms)
        if record.ttfb_ms is not None:
            self._ttfb.append(record.ttfb_ms)
        if record.rtf is not None:
            self._rtf.append(record.rtf)

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


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None
