"""Where a job's segments become audio: the one step that runs in-process or on a cluster.

A speech job plans, caches, joins, tracks and frames; for the audio itself it opens a render
session (`async with renderer.session(work) as session`) and asks it for one segment at a time
(`await session.render(text)`). Opening a session is where a new request is admitted or refused
(429). The session takes the request's place in the model's lane and a lease on the model when
it renders, and lets both go when the job is about to wait (`await session.idle()`, before it
waits for text or for its reader) or the session ends: a request holds nothing while it has no
engine work. `LocalRenderer` is the single-process form: the lane admits the request, the
registry leases the model, each segment waits for its client's lane turn and runs
`render_segment` on the lane's engine thread. On a cluster the same `LocalRenderer` runs inside
each engine replica, and the job talks to a renderer that forwards sessions there
(`app.cluster.remote`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from app.audio import dsp
from app.serving import tracing
from app.serving.scheduler import Lane
from engines.base import (
    Audio,
    Cancelled,
    CancelToken,
    Engine,
    SynthesisFailed,
    SynthesisRequest,
    TimedEngine,
    VoxMuxError,
    WordTiming,
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
    timings: bool = False
    """Whether the request asked for word timings (engines without them then refuse it)."""
    client: str = ""
    """Who asked: the lane shares places and turns out by client."""
    progress: Callable[[Progress], None] = lambda _: None
    abandon: Callable[[BaseException], None] = lambda _: None
    """Told why a segment is being abandoned (a timeout), before the engine has stopped."""
    rendered: Callable[[], None] = lambda: None
    """Called in the engine thread after each segment (the job samples its memory there)."""
    background: bool = False
    """A long-form job's work: its segments wait while interactive requests want the engine."""
    admitted: bool = False
    """The request is under way already (a later run of an SSML voice switch): the session is
    not admitted again, its place is waited for (a 200 already sent is never refused after)."""


Words = tuple[WordTiming, ...]


@dataclass(frozen=True)
class Rendered:
    """One segment's finished audio chunks (trimmed, stretched, faded) and, when asked for, its
    words, timed from the segment's first sample, spans in the segment's text."""

    chunks: list[Audio]
    words: Words = ()


class RenderSession(Protocol):
    async def render(self, text: str) -> Rendered: ...

    async def idle(self) -> None:
        """Let go of what the session holds for the request (its place, the model) until the
        next `render`: the job is about to wait for something other than the engine."""


class Renderer(Protocol):
    def session(self, work: RenderWork) -> AbstractAsyncContextManager[RenderSession]:
        """A session for `work`; raises `Overloaded` when the model takes no new request."""


def render_segment(engine: Engine, text: str, work: RenderWork) -> Rendered:
    """Synthesize and finish one segment; blocking (an engine thread, off the event loop)."""
    request = SynthesisRequest(text=text, voice=work.voice, speed=work.native_speed,
                               language=work.language, cancel=work.cancel, timings=work.timings)
    chunks: list[Audio] = []
    words: list[WordTiming] = []
    samples = 0
    rate = engine.sample_rate
    try:
        if work.timings and isinstance(engine, TimedEngine):
            timed: Iterator[tuple[Audio, Words]] = (
                (c.audio, c.words) for c in engine.stream_timed(request))
        else:
            timed = ((c, ()) for c in engine.stream(request))
        for chunk, chunk_words in timed:
            work.cancel.check()
            if len(chunk):
                audio, placed = _finish_chunk(np.asarray(chunk, dtype=np.float32), chunk_words,
                                              work, rate)
                words += (w.moved(shift=samples / rate) for w in placed)
                samples += len(audio)
                chunks.append(audio)
    except VoxMuxError:
        raise
    except Exception as exc:
        if work.cancel.cancelled:  # the engine stopped because we told it to
            raise Cancelled("The request was cancelled") from exc
        log.exception("engine %s failed on a segment", work.model_id)
        raise SynthesisFailed(f"The {work.model_id} engine failed: {exc}") from exc
    work.rendered()
    return Rendered(chunks, tuple(words))


def _finish_chunk(chunk: Audio, words: Words, work: RenderWork, rate: int
                  ) -> tuple[Audio, Words]:
    """Trim, stretch, limit and fade one chunk; its words follow the trim and the stretch.

    The silence kept around the sound scales with the tempo, like the speech inside it (here
    with the engine's part of the speed; the stretch scales it with the rest)."""
    stretch = work.stretch
    start, end = dsp.voiced_span(chunk, rate, keep_ms=dsp.KEEP_MS / work.native_speed)
    audio = chunk[start:end]
    scale = 1.0
    if abs(stretch - 1.0) > 1e-3:
        stretched = dsp.time_stretch(audio, stretch, rate)
        scale = len(stretched) / len(audio) if len(audio) else 1.0
        audio = stretched
    if words:
        limit = len(audio) / rate
        words = tuple(w.moved(scale=scale, shift=-start / rate * scale, high=limit)
                      for w in words)
    return dsp.fade_edges(dsp.peak_limit(audio), rate), words


class LocalRenderer:
    """Segments rendered in this process: lane admission, a registry lease, lane turns.

    `admission=False` (an engine replica of a cluster, where Serve admits and queues requests
    before they arrive): no places, no refusals; only the lease and the turns."""

    def __init__(self, registry: EngineRegistry[Lane], timeout: float, *,
                 admission: bool = True) -> None:
        self.registry = registry
        self.timeout = timeout
        self.admission = admission

    @asynccontextmanager
    async def session(self, work: RenderWork) -> AsyncIterator[RenderSession]:
        handle = self.registry[work.model_id]
        if self.admission and not work.admitted:
            handle.lane.admit(work.client)
        session = _LocalSession(self.registry, handle.lane, work, self.timeout, self.admission)
        try:
            yield session
        finally:
            await session.idle()


class _LocalSession:
    def __init__(self, registry: EngineRegistry[Lane], lane: Lane, work: RenderWork,
                 timeout: float, admission: bool) -> None:
        self._registry = registry
        self._lane = lane
        self._work = work
        self._timeout = timeout
        self._admission = admission
        self._held: AsyncExitStack | None = None
        self._engine: Engine | None = None

    async def render(self, text: str) -> Rendered:
        """Wait for a turn, then render; the request timeout bounds both."""
        work, loop = self._work, asyncio.get_running_loop()
        engine = await self._hold()
        deadline = loop.time() + self._timeout
        async with self._lane.turn(work.ticket, self._timeout, work.client,
                                   work.background) as turn:
            work.progress("running")
            remaining = max(0.001, deadline - loop.time())
            call = functools.partial(render_segment, engine, text, work)
            with tracing.span("segment", {"voxmux.model": work.model_id,
                                          "voxmux.voice": work.voice,
                                          "voxmux.characters": len(text)}) as span:
                rendered = await turn.call(call, work.cancel, remaining, abandon=work.abandon)
                if span.is_recording():
                    samples = sum(len(chunk) for chunk in rendered.chunks)
                    span.set_attribute("voxmux.audio_seconds", samples / engine.sample_rate)
                return rendered

    async def _hold(self) -> Engine:
        """The request's place and the model's lease, taken unless held already."""
        if self._held is not None and self._engine is not None:
            return self._engine
        work = self._work
        held = AsyncExitStack()
        try:
            if self._admission:
                await held.enter_async_context(
                    self._lane.place(work.ticket, work.client, self._timeout))
            ready = self._registry[work.model_id].status is ModelStatus.READY
            work.progress("queued" if ready else "loading")
            self._engine = await held.enter_async_context(self._registry.lease(work.model_id))
        except BaseException:
            await held.aclose()
            raise
        self._held = held
        return self._engine

    async def idle(self) -> None:
        held, self._held, self._engine = self._held, None, None
        if held is not None:
            await held.aclose()
