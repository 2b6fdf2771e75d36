"""The speech job: one request, one owner of everything it holds, one end.

`async with service.speak(plan) as job:` starts the job and, whatever ends the block (the last
event read, an error, a cancel, a client gone before the first byte), does not return until the
job has stopped: the engine call it started has really returned and its place and model lease are
released. Inside, a protocol reads `job.events()`: audio chunks, each segment followed by its
`SegmentEnd`, then the end of the iteration or the job's error. A job ends exactly once, however
and whenever it is cancelled (even before its task first ran): its record leaves the running
set, its stats are built and its reader sees the end.

The work runs in a producer task, so a cancel reaches the engine at once (the cancel token stops
the running call at its next step, inside an ONNX inference through `RunOptions.terminate`).
The producer holds the request's place and lease only while it renders (`app.serving.render`):
before it waits (for the next sentence of streamed text, or for a reader more than
`buffer_samples` of audio behind) it lets them go, so an idle text socket or a slow reader holds
nothing a model's other requests need. The steps around the engine are modules of their own:
the cache lookup and store (`caching`), the joining of segments with pauses and word times
(`assembly`) and the measuring (`meter`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from app.serving import tracing
from app.serving.assembly import Assembly, Joined
from app.serving.budgets import AudioBudget
from app.serving.cache import AudioCache
from app.serving.caching import CacheStep
from app.serving.events import JobEvent
from app.serving.meter import Meter
from app.serving.plan import Speaker, SpeechPlan
from app.serving.record import RenderRecord
from app.serving.render import Progress, Rendered, Renderer, RenderSession, RenderWork
from app.serving.tracking import CacheUse, Outcome, RequestRecord, RequestStats, RequestStatus
from app.text.feed import TextFeed
from engines.base import (
    Audio,
    Cancelled,
    CancelToken,
    Overloaded,
    RequestTimeout,
    SynthesisFailed,
    VoxMuxError,
)

log = logging.getLogger(__name__)


class _End:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class EventBuffer:
    """Events waiting for the reader. Audio past `limit` samples makes the producer wait
    (`room()`) before it renders more; events are never refused."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._queue: asyncio.Queue[JobEvent | _End] = asyncio.Queue()
        self._samples = 0
        self._room = asyncio.Event()
        self._room.set()

    def put(self, item: JobEvent | _End) -> None:
        if isinstance(item, np.ndarray):
            self._samples += len(item)
            if self._samples > self.limit:
                self._room.clear()
        self._queue.put_nowait(item)

    async def get(self) -> JobEvent | _End:
        item = await self._queue.get()
        if isinstance(item, np.ndarray):
            self._samples -= len(item)
            if self._samples <= self.limit:
                self._room.set()
        return item

    @property
    def full(self) -> bool:
        return not self._room.is_set()

    async def room(self) -> None:
        await self._room.wait()


@dataclass(frozen=True)
class JobContext:
    """What a job uses of the service: `started` is told when the job starts, `finished` once
    it has ended (both only for jobs with a record)."""

    renderer: Renderer
    cache: AudioCache
    record: Callable[[SpeechPlan], RenderRecord]
    pause_ms: int
    buffer_seconds: float
    started: Callable[[SpeechJob], None]
    finished: Callable[[SpeechJob], None]
    ready: Callable[[str], Awaitable[None]] | None = None
    """Loads a model an SSML voice switches to, before the request's first byte (so a model
    that cannot load is the request's error, not a stream cut short)."""


class SpeechJob:
    def __init__(self, plan: SpeechPlan, context: JobContext) -> None:
        self.plan = plan
        self.record: RequestRecord | None = None if plan.internal else RequestRecord(
            id=plan.request_id, model=plan.model_id, voice=plan.voice,
            chars=len(plan.text) if isinstance(plan.text, str) else 0,
            segments=None if plan.streamed else len(plan.segments),
        )
        self.meter = Meter(plan.sample_rate, engine_time_only=plan.streamed,
                           clock=self._text_clock)
        self.meter.cache = "off" if plan.streamed else "miss"
        self.stats: RequestStats | None = None
        """Built once, when the job has ended."""
        self._context = context
        self._cancel = CancelToken()
        self._buffer = EventBuffer(int(context.buffer_seconds * plan.sample_rate))
        self._task: asyncio.Task[None] | None = None
        self._reported: BaseException | None = None
        """A failure already told to the reader."""
        self._ended = False
        self._budget = (AudioBudget(plan.audio_limit, plan.sample_rate)
                        if plan.audio_limit is not None else None)
        self._span = tracing.current()
        """The request's span (its root span), which the job describes."""

    @property
    def ticket(self) -> str:
        return self.record.ticket if self.record else self.plan.request_id

    @property
    def sample_rate(self) -> int:
        return self.plan.sample_rate

    @property
    def cache_use(self) -> CacheUse:
        return self.meter.cache

    @property
    def segments(self) -> int:
        """Segments planned, or for streamed text those spoken so far."""
        return self.meter.segments if self.plan.streamed else len(self.plan.segments)

    # -- ownership ---------------------------------------------------------------------------

    async def __aenter__(self) -> SpeechJob:
        self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start working; once only. From here on the job ends exactly once."""
        if self._task is not None:
            return
        if self.record is not None:
            self._context.started(self)
        if self._span.is_recording():
            self._span.set_attributes(self.plan.traced())
        self.meter.begin()
        self._task = asyncio.create_task(self._produce(), name=f"speech-{self.ticket}")
        self._task.add_done_callback(self._on_done)

    def cancel(self) -> None:
        """Stop the job: no further segments, the running engine call stops at its next step."""
        self._cancel.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def close(self) -> None:
        """Cancel what is still running and wait until it has stopped; safe to call twice.
        Raises `CancelledError` only when the caller itself was cancelled meanwhile."""
        task = self._task
        if task is None:
            return
        if not task.done():
            self.cancel()
        interrupted = False
        while not task.done():
            try:
                await asyncio.wait({task})  # never raises the task's own outcome
            except asyncio.CancelledError:
                interrupted = True  # our caller is cancelled too: finish the wait, then tell it
        if interrupted:
            raise asyncio.CancelledError

    # -- reading -----------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[JobEvent]:
        """Audio chunks and segment ends in order; raises the job's error at the end."""
        self.start()
        while True:
            item = await self._buffer.get()
            if isinstance(item, _End):
                self._buffer.put(item)  # a second reader sees the same end
                if item.error is not None:
                    raise item.error
                return
            yield item

    async def audio(self) -> AsyncIterator[Audio]:
        async for event in self.events():
            if isinstance(event, np.ndarray):
                yield event

    async def whole(self) -> Audio:
        chunks = [chunk async for chunk in self.audio()]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)

    # -- ending --------------------------------------------------------------------------------

    def _on_done(self, task: asyncio.Task[None]) -> None:
        """The job's one end, whatever ended its task (also a cancel before it first ran)."""
        if task.cancelled():
            error: BaseException | None = asyncio.CancelledError()
        else:
            error = task.exception()
        if error is None:
            self._end("done", None)
        else:
            # A failure told to the reader early (a timeout) stays the reason, even if the
            # reader then cancelled the job while the engine was stopping.
            self._end(*_outcome(self._reported or error))

    def _end(self, outcome: Outcome, failure: VoxMuxError | None) -> None:
        if self._ended:
            return
        self._ended = True
        self.stats = self.meter.stats(outcome, failure, self.segments)
        if self._span.is_recording():
            self._span.set_attributes(_measured(self.stats))
            if failure is not None and outcome != "cancelled":
                tracing.failed(failure, self._span)
        if self.record is not None:
            self._context.finished(self)
        if self._reported is None:
            self._buffer.put(_End(failure))

    def _report(self, error: BaseException) -> None:
        """Tell the reader about a failure now, before the engine has finished stopping."""
        if self._reported is None and not isinstance(error, asyncio.CancelledError):
            self._reported = error
            self._buffer.put(_End(error))

    def _text_clock(self) -> float | None:
        """When the request's clock started, for streamed text: its first fragment."""
        text = self.plan.text
        return text.first_text_at if isinstance(text, TextFeed) else None

    # -- producing -----------------------------------------------------------------------------

    def _status(self, status: RequestStatus) -> None:
        if self.record is not None and not self.record.finished:
            self.record.status = status

    def _progress(self, progress: Progress) -> None:
        if progress == "running" and self.meter.first_audio is not None:
            self._status("streaming")
        else:
            self._status(progress)

    def _emit(self, assembly: Assembly, joined: Joined) -> None:
        if self._budget is not None:
            self._budget.add(joined.samples)
        for event in assembly.events(joined):
            if isinstance(event, np.ndarray) and self.meter.audio(len(event)):
                self._status("streaming")
            self._buffer.put(event)
        self.meter.segments += 1
        if self.record is not None:
            self.record.segments_done = self.meter.segments

    async def _produce(self) -> None:
        plan = self.plan
        assembly = Assembly(plan, self._context.pause_ms)
        cache = None
        if (self._context.cache.enabled and plan.cacheable and not plan.internal
                and not plan.streamed):
            cache = CacheStep(self._context.cache, self._context.record(plan),
                              timed=plan.timestamps)
            cached = await cache.lookup()
            self.meter.cache = "hit" if cached is not None else "miss"
            if cached is not None:
                for joined in assembly.replay(cached):
                    self._emit(assembly, joined)
                return
        index = plan.start
        runs = plan.runs()
        if self._context.ready is not None and runs:
            for model_id in sorted({s.handle.id for s, _ in runs[1:]} - {runs[0][0].handle.id}):
                await self._context.ready(model_id)
        for speaker, end in runs:  # one run unless SSML switches voice or language
            work = self._work(speaker, index, end, admitted=index > plan.start)
            async with self._context.renderer.session(work) as session:
                while index != end and (
                        text := await self._next_segment(index, session)) is not None:
                    rendered = await self._render(session, text)
                    rate = speaker.engine.sample_rate
                    join = functools.partial(assembly.join, index, text, rendered, rate)
                    joined = (await asyncio.to_thread(join) if assembly.reshapes(index, rate)
                              else join())
                    if cache is not None:
                        cache.keep(joined)
                    self._emit(assembly, joined)
                    index += 1
        if cache is not None:
            await cache.store(plan.engine, plan.sample_rate, plan.speakers)

    async def _next_segment(self, index: int, session: RenderSession) -> str | None:
        """The next text to render, once the reader has room for it. Whatever the job waits
        for here, it waits holding nothing (`session.idle()`)."""
        if self._buffer.full:
            await session.idle()
            await self._buffer.room()
        text = self.plan.text
        if isinstance(text, TextFeed):
            if not text.ready:
                await session.idle()
            return await text.next()
        return self.plan.segments[index] if index < len(self.plan.segments) else None

    async def _render(self, session: RenderSession, text: str) -> Rendered:
        started = time.perf_counter()
        try:
            return await session.render(text)
        finally:
            self.meter.engine_time(time.perf_counter() - started)

    def _work(self, speaker: Speaker, start: int, end: int | None, *, admitted: bool = False
              ) -> RenderWork:
        """The work of one run: segments `start` to `end` (a feed's: all that come);
        `admitted`: a later run, of a request under way."""
        plan = self.plan
        return RenderWork(
            ticket=self.ticket, model_id=speaker.handle.id, voice=speaker.voice,
            native_speed=speaker.native_speed, stretch=speaker.stretch,
            language=speaker.language,
            segments=None if plan.streamed else tuple(plan.segments[start:end]),
            cancel=self._cancel,
            timings=plan.timestamps, client=plan.client, progress=self._progress,
            abandon=self._report, rendered=self.meter.sample_memory,
            background=plan.background, admitted=admitted,
        )


def _measured(stats: RequestStats) -> dict[str, str | int | float | bool]:
    measured: dict[str, str | int | float | bool] = {
        "voxmux.outcome": stats.outcome, "voxmux.segments": stats.segments,
        "voxmux.audio_seconds": stats.audio_duration_ms / 1000}
    if stats.cache != "off":
        measured["voxmux.cache_hit"] = stats.cache == "hit"
    if stats.ttfb_ms is not None:
        measured["voxmux.first_audio_ms"] = stats.ttfb_ms
    return measured


def _outcome(exc: BaseException) -> tuple[Outcome, VoxMuxError]:
    """How a job that ended with `exc` ended, and the error its reader gets."""
    if isinstance(exc, asyncio.CancelledError | Cancelled):
        return "cancelled", Cancelled("The request was cancelled")
    if isinstance(exc, Overloaded):
        return "rejected", exc
    if isinstance(exc, RequestTimeout):
        return "timeout", exc
    if isinstance(exc, VoxMuxError):
        return "error", exc
    log.error("speech job failed", exc_info=exc)
    return "error", SynthesisFailed(f"The engine failed: {exc}")
