"""Where a job's segments become audio: the one step that runs in-process or on a cluster.

A speech job plans, caches, joins, tracks and frames; for the audio itself it opens a render
session (`async with renderer.session(work) as session`) and asks it for one segment at a time
(`await session.render(text)`). The session owns the request's place and lease for as long as it
is open. `LocalRenderer` is the single-process form: the model's lane admits the request (429
beyond its queue), the registry leases the model, each segment waits for a lane turn and runs
`render_segment` on the lane's engine thread. On a cluster the same `LocalRenderer` runs inside
each engine replica, and the job talks to a renderer that forwards sessions there
(`app.cluster.remote`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from app.audio import dsp
from app.serving.scheduler import Lane
from engines.base import (
    Audio,
    Cancelled,
    CancelToken,
    Engine,
    SynthesisFailed,
    SynthesisRequest,
    VoxMuxError,
)
from engines.registry import EngineRegistry, ModelStatus

log = logging.getLogger(__name__)

Progress = Literal["queued", "loading", "running"]
"""What a session tells its job: admitted and waiting (model ready or loading), or a segment's
engine call has begun."""


@dataclass(frozen=True)
class RenderWork:
    """What a render session needs of one request."""

    ticket: str
    model_id: str
    voice: str
    native_speed: float
    stretch: float
    """Pitch-preserving time-stretch applied after the engine (speed beyond its own range)."""
    language: str | None
    segments: tuple[str, ...] | None
    """Every segment when known up front; None for streamed text (segments come one by one)."""
    cancel: CancelToken
    progress: Callable[[Progress], None] = lambda _: None
    abandon: Callable[[BaseException], None] = lambda _: None
    """Told why a segment is being abandoned (a timeout), before the engine has stopped."""


class RenderSession(Protocol):
    async def render(self, text: str) -> list[Audio]:
        """One segment's finished audio chunks (trimmed, stretched, faded)."""


class Renderer(Protocol):
    def session(self, work: RenderWork) -> AbstractAsyncContextManager[RenderSession]:
        """Hold a request place and the model for `work` until the block ends; raises
        `Overloaded` when the model's queue is full."""


def render_segment(engine: Engine, text: str, work: RenderWork) -> list[Audio]:
    """Synthesize and finish one segment; blocking (an engine thread, off the event loop)."""
    request = SynthesisRequest(text=text, voice=work.voice, speed=work.native_speed,
                               language=work.language, cancel=work.cancel)
    chunks: list[Audio] = []
    try:
        for chunk in engine.stream(request):
            work.cancel.check()
            if len(chunk):
                audio = np.asarray(chunk, dtype=np.float32)
                chunks.append(_finish_chunk(audio, work.stretch, engine.sample_rate))
    except VoxMuxError:
        raise
    except Exception as exc:
        if work.cancel.cancelled:  # the engine stopped because we told it to
            raise Cancelled("The request was cancelled") from exc
        log.exception("engine %s failed on a segment", work.model_id)
        raise SynthesisFailed(f"The {work.model_id} engine failed: {exc}") from exc
    return chunks


def _finish_chunk(chunk: Audio, stretch: float, rate: int) -> Audio:
    audio = dsp.trim_silence(chunk, rate)
    if abs(stretch - 1.0) > 1e-3:
        audio = dsp.time_stretch(audio, stretch, rate)
    return dsp.fade_edges(dsp.peak_limit(audio), rate)


class LocalRenderer:
    """Segments rendered in this process: lane admission, a registry lease, lane turns."""

    def __init__(self, registry: EngineRegistry[Lane], timeout: float) -> None:
        self.registry = registry
        self.timeout = timeout

    @asynccontextmanager
    async def session(self, work: RenderWork) -> AsyncIterator[RenderSession]:
        handle = self.registry[work.model_id]
        async with handle.lane.admitted(work.ticket):
            work.progress("queued" if handle.status is ModelStatus.READY else "loading")
            async with self.registry.lease(work.model_id) as engine:
                yield _LocalSession(handle.lane, engine, work, self.timeout)


class _LocalSession:
    def __init__(self, lane: Lane, engine: Engine, work: RenderWork, timeout: float) -> None:
        self._lane = lane
        self._engine = engine
        self._work = work
        self._timeout = timeout

    async def render(self, text: str) -> list[Audio]:
        """Wait for a turn, then render; the request timeout bounds both."""
        work, loop = self._work, asyncio.get_running_loop()
        deadline = loop.time() + self._timeout
        async with self._lane.turn(work.ticket, self._timeout) as turn:
            work.progress("running")
            remaining = max(0.001, deadline - loop.time())
            call = functools.partial(render_segment, self._engine, text, work)
            return await turn.call(call, work.cancel, remaining, abandon=work.abandon)
