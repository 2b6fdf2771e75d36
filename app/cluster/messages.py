"""What the ingress and the engine replicas send each other (pickled by Ray)."""

from __future__ import annotations

from dataclasses import dataclass

from app.serving.render import Progress
from engines.base import Audio, VoxMuxError, WordTiming


@dataclass(frozen=True)
class RenderRequest:
    """One render session: the segments of a request (or one sentence of streamed text)."""

    ticket: str
    model_id: str
    voice: str
    native_speed: float
    stretch: float
    language: str | None
    segments: tuple[str, ...]
    timings: bool = False
    client: str = ""
    """Who asked (the ingress knows): the replica's lanes share places and turns by client."""


@dataclass(frozen=True)
class Update:
    """The request's progress on the replica (admitted, loading, its first engine call)."""

    progress: Progress


@dataclass(frozen=True)
class Failure:
    """The request failed on the replica; the error is the one the single process raises."""

    error: VoxMuxError


@dataclass(frozen=True)
class Segment:
    """One segment's finished audio chunks, its words, and the replica that rendered them."""

    chunks: list[Audio]
    replica: str
    words: tuple[WordTiming, ...] = ()
