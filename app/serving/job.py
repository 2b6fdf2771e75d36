"""The speech job: one request, one owner of everything it holds.

`async with service.speak(plan) as job:` starts the job and, whatever ends the block (the last
event read, an error, a cancel, a client gone before the first byte), does not return until the
job has stopped: its request place, its engine lease and its engine turn are released only once
the engine call has really returned. Inside, a protocol reads `job.events()`: audio chunks, each
segment followed by its `SegmentEnd`, then the end of the iteration or the job's error.

The work runs in a producer task, so a slow reader never holds an engine (audio waits in memory)
and a cancel reaches the engine at once: the cancel token stops the running call at its next
step (inside an ONNX inference through `RunOptions.terminate`). A request found in the audio
cache is replayed without a request place, a lease or an engine. The segments themselves come
from a render session (`app.serving.render`): in this process, or on an engine replica of a
cluster; everything else a job does is the same either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from app.audio import dsp
from app.serving.cache import AudioCache, CachedAudio
from app.serving.memory import MemoryTracker
from app.serving.render import Progress, Rendered, Renderer, RenderSession, RenderWork
from app.serving.scheduler import Lane
from app.serving.tracking import CacheUse, Outcome, RequestRecord, RequestStats, RequestStatus
from app.text.feed import TextFeed
from app.text.split import join_kind
from engines.base import (
    Audio,
    Cancelled,
    CancelToken,
    Engine,
    Overloaded,
    RequestTimeout,
    SynthesisFailed,
    VoxMuxError,
    WordTiming,
)
from engines.registry import ModelHandle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentEnd:
    """Follows the last audio chunk of one segment in `SpeechJob.events()`."""

    index: int
    text: str
    samples: int
    """Samples of this segment's audio, including the pause before it."""


@dataclass(frozen=True)
class SegmentWords:
    """Comes before the first audio chunk of a segment when the plan asks for timestamps: the
    words of that segment, timed in seconds from the start of the job's audio, with their
    spans in the request text (for streamed text, in the segment's `text`)."""

    index: int
    text: str
    words: tuple[WordTiming, ...]


JobEvent = Audio | SegmentEnd | SegmentWords

Words = tuple[WordTiming, ...]


@dataclass
class SpeechPlan:
    """A request checked and ready to run: everything that can fail before a byte is sent has
    been checked by `SpeechService.plan`."""

    handle: ModelHandle[Lane]
    request_id: str
    voice: str
    text: str | TextFeed
    """The whole text, or the feed a text-in session writes to."""
    segments: list[str]
    """The text cut for the engine; empty for a feed, whose sentences come as they complete."""
    native_speed: float
    stretch: float
    """Pitch-preserving time-stretch applied after the engine (speed beyond its own range)."""
    language: str | None
    warnings: list[str] = field(default_factory=list)
    internal: bool = False
    """A warm-up: no cache, no record, no metrics."""
    timestamps: bool = False
    """Word timings wanted: `SegmentWords` events come before each segment's audio."""
    offsets: list[int] = field(default_factory=list)
    """Where each of `segments` starts in `text` (segments are slices of it)."""

    @property
    def model_id(self) -> str:
        return self.handle.id

    @property
    def speed(self) -> float:
        """The tempo asked for: the engine's part times the stretch."""
        return self.native_speed * self.stretch

    @property
    def engine(self) -> Engine:
        return self.handle.engine

    @property
    def sample_rate(self) -> int:
        return self.handle.engine.sample_rate

    @property
    def streamed(self) -> bool:
        return isinstance(self.text, TextFeed)


class _End:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error


@dataclass(frozen=True)
class JobContext:
    """What a job uses of the service: `started` is told when the job starts, `finished` once
    it has stopped (both only for jobs with a record)."""

    renderer: Renderer
    cache: AudioCache
    cache_key: Callable[[SpeechPlan], str]
    timeout: float
    pause_ms: int
    started: Callable[[SpeechJob], None]
    finished: Callable[[SpeechJob], None]


class SpeechJob:
    def __init__(self, plan: SpeechPlan, context: JobContext) -> None:
        self.plan = plan
        self.record: RequestRecord | None = None if plan.internal else RequestRecord(
            id=plan.request_id, model=plan.model_id, voice=plan.voice,
            chars=len(plan.text) if isinstance(plan.text, str) else 0,
            segments=None if plan.streamed else len(plan.segments),
        )
        self.stats: RequestStats | None = None
        """Built once, when the job has stopped."""
        self.cache_use: CacheUse = "off" if plan.streamed else "miss"
        self._context = context
        self._cache_key: str | None = None
        self._cached: CachedAudio | None = None
        self._cancel = CancelToken()
        self._events: asyncio.Queue[JobEvent | _End] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._reported: BaseException | None = None
        """A failure already told to the reader."""
        self._memory: MemoryTracker | None = None
        self._started = time.perf_counter()
        self._first_audio: float | None = None
        self._samples = 0
        self._segments_done = 0
        self._synthesis_s = 0.0

    @property
    def ticket(self) -> str:
        return self.record.ticket if self.record else self.plan.request_id

    @property
    def sample_rate(self) -> int:
        return self.plan.sample_rate

    @property
    def segments(self) -> int:
        """Segments planned, or for streamed text those spoken so far."""
        return len(self.plan.segments) if not self.plan.streamed else self._segments_done

    # -- ownership ---------------------------------------------------------------------------

    async def __aenter__(self) -> SpeechJob:
        self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def start(self) -> None:
        """Start working (the cache lookup is the job's first step); once only."""
        if self._task is not None:
            return
        plan = self.plan
        if self._context.cache.enabled and not plan.internal and not plan.streamed:
            self._cache_key = self._context.cache_key(plan)
        if self.record is not None:
            self._context.started(self)
        self._memory = MemoryTracker()
        self._task = asyncio.create_task(self._produce(), name=f"speech-{self.ticket}")

    def cancel(self) -> None:
        """Stop the job: no further segments, the running engine call stops at its next step."""
        self._cancel.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def close(self) -> None:
        """Cancel what is still running and wait until it has stopped; safe to call twice."""
        task = self._task
        if task is None:
            return
        if not task.done():
            self.cancel()
        interrupted = False
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                interrupted = True  # our caller is cancelled too: finish the wait, then tell it
            except Exception:
                break
        if interrupted:
            raise asyncio.CancelledError

    # -- reading -----------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[JobEvent]:
        """Audio chunks and segment ends in order; raises the job's error at the end."""
        self.start()
        while True:
            item = await self._events.get()
            if isinstance(item, _End):
                self._events.put_nowait(item)  # a second reader sees the same end
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

    # -- producing ---------------------------------------------------------------------------

    def _emit(self, event: JobEvent) -> None:
        self._events.put_nowait(event)

    def _report(self, error: BaseException) -> None:
        """Tell the reader about a failure now, before the engine has finished stopping."""
        if self._reported is None and not isinstance(error, asyncio.CancelledError):
            self._reported = error
            self._events.put_nowait(_End(error))

    def _status(self, status: RequestStatus) -> None:
        if self.record is not None and not self.record.finished:
            self.record.status = status

    async def _produce(self) -> None:
        try:
            if self._cache_key is not None:
                self._cached = await self._context.cache.get(self._cache_key,
                                                             timed=self.plan.timestamps)
                self.cache_use = "hit" if self._cached is not None else "miss"
            if self._cached is not None:
                self._replay(self._cached)
            else:
                await self._synthesize()
        except (Exception, asyncio.CancelledError) as exc:  # a cancel ends here, as "cancelled"
            # A failure told to the reader early (a timeout) stays the reason, even if the
            # reader then cancelled the job while the engine was stopping.
            self._finish(*_outcome(self._reported or exc))
        else:
            self._finish("done", None)

    def _finish(self, outcome: Outcome, failure: VoxMuxError | None) -> None:
        assert self._memory is not None
        now = time.perf_counter()
        clock = self._clock()
        audio_ms = round(self._samples / self.sample_rate * 1000, 1)
        total_ms = round((now - clock) * 1000, 1)
        error = None
        if failure is not None and outcome != "cancelled":
            error = f"{type(failure).__name__}: {failure.message}"
        # Streamed text waits on its writer between sentences: its RTF counts engine time only.
        busy_ms = self._synthesis_s * 1000 if self.plan.streamed else total_ms
        self.stats = RequestStats(
            outcome=outcome,
            error=error,
            started=self._started,
            t_total_ms=total_ms,
            ttfb_ms=round((self._first_audio - clock) * 1000, 1) if self._first_audio else None,
            audio_duration_ms=audio_ms,
            rtf=round(busy_ms / audio_ms, 4) if audio_ms else None,
            segments=self.segments,
            cache=self.cache_use,
            mem=self._memory.finish(),
        )
        if self.record is not None:
            self._context.finished(self)
        if self._reported is None:
            self._events.put_nowait(_End(failure))

    def _clock(self) -> float:
        """When the request's clock started: for streamed text, its first fragment."""
        text = self.plan.text
        if isinstance(text, TextFeed) and text.first_text_at is not None:
            return text.first_text_at
        return self._started

    def _audio_out(self, chunk: Audio) -> None:
        if self._first_audio is None:
            self._first_audio = time.perf_counter()
            self._status("streaming")
        self._samples += len(chunk)
        self._emit(chunk)

    def _segment_done(self, index: int, text: str, samples: int) -> None:
        self._segments_done += 1
        if self.record is not None:
            self.record.segments_done = self._segments_done
        self._emit(SegmentEnd(index, text, samples))

    def _replay(self, entry: CachedAudio) -> None:
        chunks = iter(entry.chunks)
        for index, count in enumerate(entry.segment_chunks):
            if self.plan.timestamps and entry.words is not None:
                text = self.plan.segments[index]
                words = entry.segment_words(index, text)
                self._emit(SegmentWords(index, text, self._placed(index, words)))
            samples = 0
            for _ in range(count):
                chunk = next(chunks)
                samples += len(chunk)
                self._audio_out(chunk)
            text = self.plan.segments[index] if index < len(self.plan.segments) else ""
            self._segment_done(index, text, samples)

    def _work(self) -> RenderWork:
        plan = self.plan
        return RenderWork(
            ticket=self.ticket, model_id=plan.model_id, voice=plan.voice,
            native_speed=plan.native_speed, stretch=plan.stretch, language=plan.language,
            segments=None if plan.streamed else tuple(plan.segments), cancel=self._cancel,
            timings=plan.timestamps, progress=self._progress, abandon=self._report,
            rendered=self._sample_memory,
        )

    def _sample_memory(self) -> None:
        """After each segment, in the engine thread: never on the event loop."""
        if self._memory is not None:
            self._memory.update()

    def _progress(self, progress: Progress) -> None:
        if progress == "running" and self._first_audio is not None:
            self._status("streaming")
        else:
            self._status(progress)

    async def _synthesize(self) -> None:
        plan = self.plan
        keep: list[tuple[Audio, ...]] | None = [] if self._cache_key is not None else None
        kept_words: list[Words] = []
        size = 0
        assert self._memory is not None
        async with self._context.renderer.session(self._work()) as session:
            index = 0
            previous = ""
            while (text := await self._next_segment(index)) is not None:
                rendered = await self._segment(session, text)
                chunks, words = rendered.chunks, rendered.words
                if index and chunks:
                    pause = self._pause_after(previous)
                    chunks[0] = np.concatenate([pause, chunks[0]])
                    words = tuple(w.moved(shift=len(pause) / self.sample_rate) for w in words)
                if plan.timestamps:
                    words = tuple(w.moved(shift=self._samples / self.sample_rate) for w in words)
                    kept_words.append(words)
                    self._emit(SegmentWords(index, text, self._placed(index, words)))
                for chunk in chunks:
                    self._audio_out(chunk)
                self._segment_done(index, text, sum(len(c) for c in chunks))
                if keep is not None:  # dropped once too big: no second copy held
                    size += sum(c.nbytes for c in chunks)
                    keep = keep if self._context.cache.fits(size) else None
                    if keep is not None:
                        keep.append(tuple(chunks))
                index += 1
                previous = text
        if keep is not None and self._cache_key is not None:
            timed = (kept_words, plan.segments) if plan.timestamps else None
            await self._context.cache.put(self._cache_key, CachedAudio.build(
                plan.model_id, self.sample_rate, keep, timed))

    def _pause_after(self, segment: str) -> Audio:
        """The silence between `segment` and the next: a sentence pause after a sentence, half
        of it after a clause mark, none inside a phrase (the edges each segment keeps are the
        gap there). Pauses are part of the tempo: at twice the speed they last half as long."""
        share = {"sentence": 1.0, "clause": 0.5, "word": 0.0}[join_kind(segment)]
        return dsp.pause(self.sample_rate, self._context.pause_ms * share / self.plan.speed)

    def _placed(self, index: int, words: Words) -> Words:
        """Segment-relative spans moved to the request text (streamed text keeps them)."""
        offsets = self.plan.offsets
        if index >= len(offsets) or not offsets[index]:
            return words
        return tuple(w.moved(chars=offsets[index]) for w in words)

    async def _next_segment(self, index: int) -> str | None:
        text = self.plan.text
        if isinstance(text, TextFeed):
            return await text.next()
        return self.plan.segments[index] if index < len(self.plan.segments) else None

    async def _segment(self, session: RenderSession, text: str) -> Rendered:
        started = time.perf_counter()
        try:
            return await session.render(text)
        finally:
            self._synthesis_s += time.perf_counter() - started


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
