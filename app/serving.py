"""The speech service: every route turns its request into a `SpeechJob` and reads its audio here.

Planning (`plan`) checks everything that can be checked before a byte is sent. Running (`run`)
synthesizes segment by segment in a producer task that owns the scheduler slot and the engine
lease, so a slow reader never holds an engine and a cancel or disconnect stops the remaining
segments at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import numpy as np

from app import dsp
from app.catalogue import Catalogue, ModelEntry
from app.scheduler import Scheduler
from app.settings import Settings
from app.textsplit import split_text
from engines.base import (
    Audio,
    Cancelled,
    Engine,
    InvalidParameter,
    RequestTimeout,
    SynthesisFailed,
    SynthesisRequest,
    VoxMuxError,
)
from engines.registry import EngineRegistry

log = logging.getLogger(__name__)

_DONE = object()


@dataclass
class JobStats:
    started: float = field(default_factory=time.perf_counter)
    first_audio: float | None = None
    finished: float | None = None
    samples: int = 0
    segments_done: int = 0

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


class AudioStream:
    """Async iterator over a job's audio chunks, fed by a producer task."""

    def __init__(self, job: SpeechJob, producer: AsyncIterator[Audio]) -> None:
        self.job = job
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._task = asyncio.create_task(self._produce(producer), name=f"speech-{job.id}")

    async def _produce(self, producer: AsyncIterator[Audio]) -> None:
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
        item = await self._queue.get()
        if item is _DONE:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, np.ndarray)
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
    ) -> None:
        self.settings = settings
        self.catalogue = catalogue
        self.engines = engines
        self.registry = registry
        self.scheduler = scheduler
        self.active: dict[str, AudioStream] = {}

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

    def run(self, job: SpeechJob) -> AudioStream:
        stream = AudioStream(job, self._synthesize(job))
        self.active[job.id] = stream
        return stream

    def cancel(self, request_id: str) -> bool:
        stream = self.active.get(request_id)
        if stream is None:
            return False
        stream.cancel()
        return True

    async def _synthesize(self, job: SpeechJob) -> AsyncIterator[Audio]:
        deadline = time.monotonic() + self.settings.request_timeout
        pause = dsp.pause(job.sample_rate, self.settings.sentence_pause_ms)
        try:
            async with (
                self.scheduler.slot(job.model.id),
                self.registry.lease(job.model.id) as engine,
            ):
                for index, text in enumerate(job.segments):
                    chunks = await self._segment(engine, job, text, deadline)
                    for position, chunk in enumerate(chunks):
                        audio = self._finish_chunk(chunk, job)
                        if index and not position:
                            audio = np.concatenate([pause, audio])
                        if job.stats.first_audio is None:
                            job.stats.first_audio = time.perf_counter()
                        job.stats.samples += len(audio)
                        yield audio
                    job.stats.segments_done += 1
        finally:
            job.stats.finished = time.perf_counter()
            self.active.pop(job.id, None)

    async def _segment(
        self, engine: Engine, job: SpeechJob, text: str, deadline: float
    ) -> list[Audio]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RequestTimeout(f"The request ran past {self.settings.request_timeout:g} s")
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(_collect, engine, job.request(text)), timeout=remaining
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

    def _finish_chunk(self, chunk: Audio, job: SpeechJob) -> Audio:
        audio = dsp.trim_silence(chunk, job.sample_rate)
        if abs(job.stretch - 1.0) > 1e-3:
            audio = dsp.time_stretch(audio, job.stretch, job.sample_rate)
        return dsp.fade_edges(dsp.peak_limit(audio), job.sample_rate)

    async def warm_up(self, model_id: str) -> None:
        """One short synthesis so the first real request pays no first-run cost."""
        job = self.plan(model=model_id, text="Ready.")
        stream = self.run(job)
        try:
            async for _ in stream:
                pass
        finally:
            await stream.aclose()


def _collect(engine: Engine, request: SynthesisRequest) -> list[Audio]:
    chunks: Iterator[Audio] = engine.stream(request)
    return [np.asarray(c, dtype=np.float32) for c in chunks if len(c)]
