"""What the ingress and the engine replicas send each other (pickled by Ray)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from app.audio.encoders import to_pcm16
from app.serving.render import Progress
from engines.base import Audio, VoxMuxError, WordTiming

PCM_SCALE = np.float32(32767.0)


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
    caller: str = ""
    """The ingress replica that sent it (`<deployment>#<replica id>`; empty for a caller that is
    not a Serve replica): if it dies, the engine replica stops the work it asked for."""
    trace: dict[str, str] = field(default_factory=dict)
    """The request's trace (W3C `traceparent`), continued by the replica's spans; empty when
    the ingress does not trace."""


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
    """One segment's finished audio, its words, and the replica that rendered them. The audio
    travels as 16-bit PCM, its chunks' lengths beside it: half the bytes of float32, and what
    wav, pcm and flac hold anyway (`to_pcm16` of what arrives is exactly `to_pcm16` of what was
    rendered; the lossy encoders get a rounding 96 dB down)."""

    pcm: bytes
    lengths: tuple[int, ...]
    replica: str
    words: tuple[WordTiming, ...] = ()

    @classmethod
    def of(cls, chunks: list[Audio], replica: str, words: tuple[WordTiming, ...] = ()
           ) -> Segment:
        joined = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        return cls(to_pcm16(joined), tuple(len(c) for c in chunks), replica, words)

    def chunks(self) -> list[Audio]:
        """The chunks as float32, in an array of their own (`astype` copies: nothing stays
        pinned in Ray's object store while a slow reader waits)."""
        samples = np.frombuffer(self.pcm, dtype="<i2").astype(np.float32)
        samples /= PCM_SCALE
        chunks, at = [], 0
        for length in self.lengths:
            chunks.append(samples[at:at + length])
            at += length
        return chunks
