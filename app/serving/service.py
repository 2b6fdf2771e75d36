"""The speech service: every route turns its request into a `SpeechJob` and reads its audio here.

Planning (`plan`) checks everything that can be checked before a byte is sent. Running (`run`)
synthesizes segment by segment in a producer task that owns the scheduler slot and the engine
lease, so a slow reader never holds an engine and a cancel or disconnect stops the remaining
segments at once. A request found in the audio cache is replayed instead, with no slot, lease or
engine; every other one is cached when it succeeds. Each request keeps its line in `/requests`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field

import numpy as np

from app.audio import dsp
from app.protocols.schemas import SpeechOptions
from app.serving.cache import AudioCache, CachedAudio, cache_key
from app.serving.catalogue import Catalogue, ModelEntry
from app.serving.memory import MemoryTracker
from app.serving.metrics import Metrics
from app.serving.scheduler import Scheduler
from app.serving.tracking import Outcome, RequestRecord, RequestStatus, ServingStats
from app.settings import Settings
from app.text.split import split_text
from engines.base import (
    Audio,
    Cancelled,
    Engine,
    InvalidParameter,
    Overloaded,
    RequestTimeout,
    SynthesisFailed,
    SynthesisRequest,
    VoxMuxError,
)
from engines.registry import EngineRegistry, ModelStatus

log = logging.getLogger(__name__)

_DONE = object()


@dataclass
class JobStats:
    started: float = field(default_factory=time.perf_counter)
    first_audio: float | None = None
    finished: float | None = None
    samples: int = 0
    segments_done: int = 0
    cache: str = "miss"
    memory: MemoryTracker = field(default_factory=MemoryTracker)

    def envelope(self, sample_rate: int, segments: int) -> dict[str, object]:
        end = self.finished or time.perf_counter()
        total = end - self.started
        audio_s = self.samples / sample_rate
        return {
            "t_total_ms": round(total * 1000, 1),
            "ttfb_ms": round((self.first_audio - self.started) * 1000, 1)
            if self.first_audio else None,
            "audio_duration_ms": round(audio_s * 1000, 1),
            "rtf": round(total / audio_s, 4) if audio_s else None,
            "segments": segments,
            "cache": self.cache,
            "mem": self.memory.envelope(),
        }


@dataclass
class SpeechJob:
    id: str
    model: ModelEntry
    engine: Engine
    voice: str
    text: str
    segments: list[str]
    native_speed: float
    stretch: float
    language: str | None
    warnings: list[str]
    stats: JobStats = field(default_factory=JobStats)
    record: RequestRecord | None = None
    """This job's line in `/requests`; None for internal jobs (warm-up)."""

    @property
    def sample_rate(self) -> int:
        return self.engine.sample_rate

    def request(self, text: str) -> SynthesisRequest:
        return SynthesisRequest(
            text=text, voice=self.voice, speed=self.native_speed, language=self.language
        )


def split_speed(speed: float, native: tuple[float, float]) -> tuple[float, float]:
    """Speed -> (engine-native part, residual pitch-preserving time-stretch factor)."""
    low, high = native
    inside = min(max(speed, low), high)
    return inside, speed / inside


@dataclass(frozen=True)
class SegmentEnd:
    """Follows the last chunk of one segment in `AudioStream.next_event`'s sequence."""

    index: int
    text: str
    samples: int
    """Samples of this segment's audio, including the pause before it."""


Events = AsyncGenerator[Audio | SegmentEnd, None]
"""What a producer yields: audio chunks, each segment followed by its `SegmentEnd`."""


class AudioStream:
    """Async iterator over a job's audio chunks, fed by a producer task.

    Iterating yields audio only; `next_event` also returns a `SegmentEnd` after each segment.
    """

    def __init__(self, job: SpeechJob, producer: AsyncIterator[Audio | SegmentEnd]) -> None:
        self.job = job
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task = asyncio.create_task(self._produce(producer), name=f"speech-{job.id}")

    async def _produce(self, producer: AsyncIterator[Audio | SegmentEnd]) -> None:
        try:
            async for chunk in producer:
                self._queue.put_nowait(chunk)
            self._queue.put_nowait(_DONE)
        except asyncio.CancelledError:
            self._queue.put_nowait(Cancelled("The request was cancelled"))
            raise
        except Exception as exc:
            self._queue.put_nowait(exc)

    def __aiter__(self) -> AudioStream:
        return self

    async def __anext__(self) -> Audio:
        while True:
            item = await self.next_event()
            if not isinstance(item, SegmentEnd):
                return item

    async def next_event(self) -> Audio | SegmentEnd:
        """The next chunk or segment end; raises StopAsyncIteration at the end."""
        item = await self._queue.get()
        if item is _DONE:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, np.ndarray | SegmentEnd)
        return item

    def cancel(self) -> None:
        self._task.cancel()

    async def aclose(self) -> None:
        if not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class SpeechService:
    def __init__(
        self,
        settings: Settings,
        catalogue: Catalogue,
        engines: dict[str, Engine],
        registry: EngineRegistry,
        scheduler: Scheduler,
        *,
        cache: AudioCache | None = None,
        stats: ServingStats | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.catalogue = catalogue
        self.engines = engines
        self.registry = registry
        self.scheduler = scheduler
        self.active: dict[str, AudioStream] = {}
        self.cache = cache or AudioCache(
            settings.cache_max_items, settings.cache_max_bytes, settings.cache_max_item_bytes
        )
        self.stats = stats or ServingStats(settings.request_log_size, settings.stats_window)
        self.metrics = metrics or Metrics(scheduler, registry, self.cache)
        registry.on_change.append(self._observe_load)
        # Engine calls get threads of their own, one per scheduler slot: asyncio's default pool
        # (cores + 4 threads, shared with encoders and file I/O) would cap how many of the
        # configured slots really run at once on a small machine.
        self._engine_threads = ThreadPoolExecutor(
            max_workers=settings.concurrency * max(1, len(engines)),
            thread_name_prefix="voxmux-engine",
        )

    def close(self) -> None:
        """At shutdown: no new engine calls; one still running finishes in its thread."""
        self._engine_threads.shutdown(wait=False, cancel_futures=True)

    def resolve_voice(self, entry: ModelEntry, voice: str | None) -> str:
        if not voice:
            return entry.default_voice
        return entry.voice_map.get(voice, voice)

    def plan(
        self,
        *,
        model: str,
        text: str,
        voice: str | None = None,
        speed: float = 1.0,
        language: str | None = None,
        instructions: str | None = None,
        request_id: str | None = None,
    ) -> SpeechJob:
        entry = self.catalogue.resolve(model)
        engine = self.engines[entry.id]
        if not any(ch.isalnum() for ch in text):
            raise InvalidParameter(
                "'input' must contain text to speak (letters or digits)", param="input"
            )
        limit = self.settings.max_input_chars
        if len(text) > limit:
            raise InvalidParameter(
                f"'input' is {len(text)} characters; the limit is {limit}",
                param="input", code="string_above_max_length",
            )
        if not 0.25 <= speed <= 4.0:
            raise InvalidParameter("'speed' must be between 0.25 and 4.0", param="speed")
        warnings = []
        if instructions:
            warnings.append(f"instructions ignored: the {entry.id} engine has no style control")
        native, stretch = split_speed(speed, engine.capabilities.speed_range)
        job = SpeechJob(
            id=request_id or uuid.uuid4().hex,
            model=entry,
            engine=engine,
            voice=self.resolve_voice(entry, voice),
            text=text,
            segments=split_text(
                text,
                max_chars=engine.capabilities.max_segment_chars,
                first_max_chars=self.settings.first_segment_chars,
            ),
            native_speed=native,
            stretch=stretch,
            language=language,
            warnings=warnings,
        )
        engine.validate(job.request(job.segments[0]))
        return job

    def plan_options(self, options: SpeechOptions, text: str, request_id: str) -> SpeechJob:
        """`plan` from a route's parsed speech fields."""
        return self.plan(
            model=options.model,
            text=text,
            voice=options.voice_id,
            speed=options.speed,
            language=options.language,
            instructions=options.instructions,
            request_id=request_id,
        )

    def run(self, job: SpeechJob, *, internal: bool = False) -> AudioStream:
        """Start the job; a cached result is replayed without a slot, a lease or an engine.

        `internal` jobs (warm-up) bypass the cache and are not counted in stats or metrics.
        """
        producer: Events
        if internal:
            producer = self._synthesize(job)
        else:
            key = self.cache_key(job)
            cached = self.cache.get(key)
            job.record = self.stats.open(RequestRecord(
                id=job.id, model=job.model.id, voice=job.voice, chars=len(job.text),
                segments=len(job.segments),
            ))
            if cached is not None:
                job.stats.cache = job.record.cache = "hit"
                producer = self._tracked(job, None, self._replay(job, cached))
            else:
                producer = self._tracked(job, key, self._synthesize(job))
        stream = AudioStream(job, producer)
        self.active[job.id] = stream
        return stream

    def cache_key(self, job: SpeechJob) -> str:
        request = job.request("")
        return cache_key(
            model_id=job.model.id, voice=job.voice, speed=job.native_speed * job.stretch,
            language=job.language, params=request.params, segments=job.segments,
        )

    def invalidate_model(self, model_id: str) -> int:
        """Forget a model's cached audio; call when its voices or weights changed (rescan)."""
        dropped = self.cache.clear_model(model_id)
        if dropped:
            log.info("cache: dropped %d entries of %s", dropped, model_id)
        return dropped

    def queue_position(self, record: RequestRecord) -> int | None:
        return self.scheduler.position(record.model, record.ticket)

    def _set_status(self, job: SpeechJob, status: RequestStatus) -> None:
        if job.record is not None and not job.record.finished:
            job.record.status = status

    async def _replay(self, job: SpeechJob, entry: CachedAudio) -> Events:
        try:
            chunks = iter(entry.chunks)
            for index, count in enumerate(entry.segment_chunks):
                samples = 0
                for _ in range(count):
                    chunk = next(chunks)
                    if job.stats.first_audio is None:
                        job.stats.first_audio = time.perf_counter()
                    job.stats.samples += len(chunk)
                    samples += len(chunk)
                    yield chunk
                job.stats.segments_done += 1
                text = job.segments[index] if index < len(job.segments) else ""
                yield SegmentEnd(index, text, samples)
        finally:
            job.stats.finished = time.perf_counter()
            self.active.pop(job.id, None)

    async def _tracked(self, job: SpeechJob, key: str | None, producer: Events) -> Events:
        """Passes events through while keeping the request's record, and caches a success."""
        done: list[tuple[Audio, ...]] = []
        current: list[Audio] = []
        size = 0
        keep = key is not None and self.cache.fits(0)
        outcome: Outcome = "cancelled"  # also a consumer that stopped reading early
        error: str | None = None
        try:
            async with aclosing(producer):  # its finally frees slot and lease, however we end
                async for event in producer:
                    if isinstance(event, SegmentEnd):
                        job.stats.memory.update()
                        if job.record is not None:
                            job.record.segments_done = event.index + 1
                        if keep:
                            done.append(tuple(current))
                            current = []
                    else:
                        self._set_status(job, "streaming")
                        if keep:
                            size += event.nbytes
                            keep = self.cache.fits(size)
                            current.append(event)
                            if not keep:  # too big to cache: stop holding a second reference
                                done, current = [], []
                    yield event
            outcome = "done"
        except Overloaded as exc:
            outcome, error = "rejected", f"{exc.code}: {exc.message}"
            raise
        except RequestTimeout as exc:
            outcome, error = "timeout", exc.message
            raise
        except Cancelled:
            raise
        except VoxMuxError as exc:
            outcome, error = "error", f"{exc.code}: {exc.message}"
            raise
        except Exception as exc:
            outcome, error = "error", str(exc) or type(exc).__name__
            raise
        finally:
            job.stats.memory.finish()
            if outcome == "done" and keep and key is not None:
                if current:
                    done.append(tuple(current))
                self.cache.put(key, CachedAudio.build(job.model.id, job.sample_rate, done))
            self._close_record(job, outcome, error)

    def _close_record(self, job: SpeechJob, outcome: Outcome, error: str | None) -> None:
        if job.record is None:
            return
        envelope = job.stats.envelope(job.sample_rate, len(job.segments))
        self.stats.close(job.record, outcome, envelope, error)
        first = job.stats.first_audio
        finished = job.stats.finished or time.perf_counter()
        self.metrics.observe_request(
            job.model.id, outcome,
            total_s=finished - job.stats.started,
            ttfb_s=first - job.stats.started if first is not None else None,
            rtf=job.record.rtf,
        )

    def _observe_load(self, model_id: str, status: ModelStatus) -> None:
        if status is ModelStatus.READY:
            seconds = self.registry.status()[model_id].load_seconds
            if seconds is not None:
                self.metrics.load_seconds.labels(model_id).observe(seconds)

    def cancel(self, request_id: str) -> bool:
        stream = self.active.get(request_id)
        if stream is None:
            return False
        stream.cancel()
        return True

    async def _synthesize(self, job: SpeechJob) -> Events:
        deadline = time.monotonic() + self.settings.request_timeout
        pause = dsp.pause(job.sample_rate, self.settings.sentence_pause_ms)
        ticket = job.record.ticket if job.record else job.id
        try:
            async with (
                self.scheduler.slot(job.model.id, ticket, timeout=self.settings.request_timeout),
                self._leased(job) as engine,
            ):
                for index, text in enumerate(job.segments):
                    chunks = await self._segment(engine, job, text, deadline)
                    samples = 0
                    for position, chunk in enumerate(chunks):
                        audio = np.concatenate([pause, chunk]) if index and not position else chunk
                        if job.stats.first_audio is None:
                            job.stats.first_audio = time.perf_counter()
                        job.stats.samples += len(audio)
                        samples += len(audio)
                        yield audio
                    job.stats.segments_done += 1
                    yield SegmentEnd(index, text, samples)
        finally:
            job.stats.finished = time.perf_counter()
            self.active.pop(job.id, None)

    @asynccontextmanager
    async def _leased(self, job: SpeechJob) -> AsyncIterator[Engine]:
        ready = self.registry.status()[job.model.id].status is ModelStatus.READY
        self._set_status(job, "running" if ready else "loading")
        async with self.registry.lease(job.model.id) as engine:
            self._set_status(job, "running")
            yield engine

    async def _segment(
        self, engine: Engine, job: SpeechJob, text: str, deadline: float
    ) -> list[Audio]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RequestTimeout(f"The request ran past {self.settings.request_timeout:g} s")
        try:
            render = functools.partial(self._render, engine, job, text)
            loop = asyncio.get_running_loop()
            return await asyncio.wait_for(
                loop.run_in_executor(self._engine_threads, render), timeout=remaining
            )
        except TimeoutError as exc:
            raise RequestTimeout(
                f"The request ran past {self.settings.request_timeout:g} s"
            ) from exc
        except VoxMuxError:
            raise
        except Exception as exc:
            log.exception("engine %s failed on a segment", job.model.id)
            raise SynthesisFailed(f"The {job.model.id} engine failed: {exc}") from exc

    def _render(self, engine: Engine, job: SpeechJob, text: str) -> list[Audio]:
        """Synthesize and finish one segment; runs in a worker thread, off the event loop."""
        return [self._finish_chunk(chunk, job) for chunk in _collect(engine, job.request(text))]

    def _finish_chunk(self, chunk: Audio, job: SpeechJob) -> Audio:
        audio = dsp.trim_silence(chunk, job.sample_rate)
        if abs(job.stretch - 1.0) > 1e-3:
            audio = dsp.time_stretch(audio, job.stretch, job.sample_rate)
        return dsp.fade_edges(dsp.peak_limit(audio), job.sample_rate)

    async def warm_up(self, model_id: str) -> None:
        """One short synthesis so the first real request pays no first-run cost."""
        job = self.plan(model=model_id, text="Ready.")
        stream = self.run(job, internal=True)
        try:
            async for _ in stream:
                pass
        finally:
            await stream.aclose()


def _collect(engine: Engine, request: SynthesisRequest) -> list[Audio]:
    chunks: Iterator[Audio] = engine.stream(request)
    return [np.asarray(c, dtype=np.float32) for c in chunks if len(c)]
