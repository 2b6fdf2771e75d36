"""The speech service: every protocol plans a request here and runs it as a `SpeechJob`.

`plan()` checks everything that can be checked before a byte is sent (model, voice, text, speed)
and cuts the text into segments. `speak(plan)` returns the job, to be used as `async with`: the
job owns its request place, lease and engine turn until its engine work has stopped (see
`app.serving.job`). The service keeps the jobs running now, by internal ticket and by the
client's request id, so a cancel by id reaches every request that carries it.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict

from app.serving.cache import AudioCache, cache_key
from app.serving.job import JobContext, SpeechJob, SpeechPlan
from app.serving.memory import process_memory
from app.serving.metrics import Metrics
from app.serving.scheduler import Lane
from app.serving.tracking import RequestRecord, ServingStats
from app.settings import Settings
from app.text.feed import TextFeed
from app.text.split import split_text
from engines.base import InvalidParameter, SynthesisRequest, VoiceNotFound
from engines.registry import EngineRegistry, ModelHandle, ModelStatus

log = logging.getLogger(__name__)

WARM_UP_TEXT = "Ready."


def split_speed(speed: float, native: tuple[float, float]) -> tuple[float, float]:
    """Speed -> (engine-native part, residual pitch-preserving time-stretch factor)."""
    low, high = native
    inside = min(max(speed, low), high)
    return inside, speed / inside


class SpeechService:
    def __init__(self, settings: Settings, registry: EngineRegistry[Lane], *,
                 cache: AudioCache | None = None, stats: ServingStats | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.cache = cache or AudioCache(
            settings.cache_max_items, settings.cache_max_bytes, settings.cache_max_item_bytes
        )
        self.stats = stats or ServingStats(settings.request_log_size, settings.stats_window)
        self.metrics = Metrics(registry, self.cache)
        registry.on_change.append(self._observe_load)
        self._jobs: dict[str, SpeechJob] = {}
        """Running jobs by ticket."""
        self._by_request_id: dict[str, set[str]] = defaultdict(set)
        self._context = JobContext(registry, self.cache, self.cache_key, settings.request_timeout,
                                   settings.sentence_pause_ms, self._started, self._finished)

    def close(self) -> None:
        """At shutdown: no new engine calls; one still running finishes in its thread."""
        for handle in self.registry.handles():
            handle.lane.close()

    def models(self) -> list[ModelHandle[Lane]]:
        return self.registry.handles()

    def resolve_voice(self, handle: ModelHandle[Lane], voice: str | None) -> str:
        entry = handle.entry
        if not voice:
            return entry.default_voice
        return entry.voice_map.get(voice, voice)

    # -- planning ----------------------------------------------------------------------------

    def plan(self, *, model: str, text: str, voice: str | None = None, speed: float = 1.0,
             language: str | None = None, instructions: str | None = None,
             request_id: str | None = None, internal: bool = False) -> SpeechPlan:
        """A request checked against the model, its engine and the limits, cut into segments."""
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
        plan = self._plan(model, text, voice, speed, language, instructions, request_id)
        plan.internal = internal
        plan.segments = split_text(
            text,
            max_chars=plan.engine.capabilities.max_segment_chars,
            first_max_chars=self.settings.first_segment_chars,
        )
        self._validate_voice(plan, plan.segments[0])
        return plan

    def plan_stream(self, *, model: str, voice: str | None = None, speed: float = 1.0,
                    language: str | None = None, instructions: str | None = None,
                    request_id: str | None = None) -> SpeechPlan:
        """A text-in request: options checked now (on a probe sentence), text fed later."""
        plan = self._plan(model, "", voice, speed, language, instructions, request_id)
        plan.text = TextFeed(
            max_chars=min(plan.engine.capabilities.max_segment_chars,
                          self.settings.max_input_chars),
            first_max_chars=self.settings.first_segment_chars,
            max_pending=self.settings.ws_max_pending_chars,
        )
        self._validate_voice(plan, "Hello.")
        return plan

    def _plan(self, model: str, text: str, voice: str | None, speed: float,
              language: str | None, instructions: str | None, request_id: str | None
              ) -> SpeechPlan:
        handle = self.registry.resolve(model)
        if not 0.25 <= speed <= 4.0:
            raise InvalidParameter("'speed' must be between 0.25 and 4.0", param="speed")
        warnings = []
        if instructions:
            warnings.append(f"instructions ignored: the {handle.id} engine has no style control")
        native, stretch = split_speed(speed, handle.engine.capabilities.speed_range)
        return SpeechPlan(
            handle=handle,
            request_id=request_id or uuid.uuid4().hex,
            voice=self.resolve_voice(handle, voice),
            text=text,
            segments=[],
            native_speed=native,
            stretch=stretch,
            language=language,
            warnings=warnings,
        )

    def _validate_voice(self, plan: SpeechPlan, sample: str) -> None:
        """Validate; a voice the model lacks is refused, or with `unknown_voice=default`
        replaced by the model's default voice and named in the warnings."""
        try:
            self._validate(plan, sample)
        except VoiceNotFound as exc:
            default = plan.handle.entry.default_voice
            hint = (f"{exc.message}. GET /v1/audio/voices?model={plan.model_id} lists its voices; "
                    "other names can be mapped in the catalogue's [voice_aliases]")
            if self.settings.unknown_voice != "default" or plan.voice == default:
                raise VoiceNotFound(hint, param="voice", code=exc.code) from exc
            plan.warnings.append(
                f"voice '{plan.voice}' is not a {plan.model_id} voice; spoke {default} instead"
            )
            plan.voice = default
            self._validate(plan, sample)

    @staticmethod
    def _validate(plan: SpeechPlan, sample: str) -> None:
        plan.engine.validate(SynthesisRequest(
            text=sample, voice=plan.voice, speed=plan.native_speed, language=plan.language
        ))

    # -- running -----------------------------------------------------------------------------

    def speak(self, plan: SpeechPlan) -> SpeechJob:
        """The job for `plan`, not yet started: use it as `async with service.speak(plan)`."""
        return SpeechJob(plan, self._context)

    def _started(self, job: SpeechJob) -> None:
        assert job.record is not None
        self.stats.open(job.record)
        self._jobs[job.ticket] = job
        self._by_request_id[job.plan.request_id].add(job.ticket)

    def _finished(self, job: SpeechJob) -> None:
        assert job.record is not None and job.stats is not None
        self._jobs.pop(job.ticket, None)
        tickets = self._by_request_id.get(job.plan.request_id)
        if tickets is not None:
            tickets.discard(job.ticket)
            if not tickets:
                del self._by_request_id[job.plan.request_id]
        self.stats.close(job.record, job.stats)
        self.metrics.observe_request(job.plan.model_id, job.stats, job.plan.voice)

    def cache_key(self, plan: SpeechPlan) -> str:
        request = SynthesisRequest(text="", voice=plan.voice)
        return cache_key(
            model_id=plan.model_id, voice=plan.voice, speed=plan.native_speed * plan.stretch,
            language=plan.language, params=request.params, segments=plan.segments,
        )

    def cancel(self, request_id: str) -> int:
        """Cancel every running request that carries `request_id`; how many there were."""
        jobs = [self._jobs[t] for t in self._by_request_id.get(request_id, ()) if t in self._jobs]
        for job in jobs:
            job.cancel()
        return len(jobs)

    def running(self) -> list[SpeechJob]:
        return list(self._jobs.values())

    def queue_position(self, record: RequestRecord) -> int | None:
        return self.registry[record.model].lane.position(record.ticket)

    async def warm_up(self, model_id: str) -> None:
        """One short synthesis so the first real request pays no first-run cost."""
        plan = self.plan(model=model_id, text=WARM_UP_TEXT, internal=True)
        async with self.speak(plan) as job:
            await job.whole()

    def invalidate_model(self, model_id: str) -> int:
        """Forget a model's cached audio; call when its voices or weights changed (rescan)."""
        dropped = self.cache.clear_model(model_id)
        if dropped:
            log.info("cache: dropped %d entries of %s", dropped, model_id)
        return dropped

    def _observe_load(self, model_id: str, status: ModelStatus) -> None:
        if status is ModelStatus.READY:
            seconds = self.registry[model_id].load_seconds
            if seconds is not None:
                self.metrics.load_seconds.labels(model_id).observe(seconds)

    # -- reporting ---------------------------------------------------------------------------

    def report(self) -> dict[str, object]:
        """The body of `GET /stats`."""
        models: dict[str, object] = {}
        active = queued = 0
        for handle in self.registry.handles():
            lane = handle.lane.state()
            active += lane.running
            queued += lane.queued
            models[handle.id] = {
                "status": handle.status,
                "refcount": handle.refcount,
                "load_seconds": handle.load_seconds,
                "active": lane.running,
                "queued": lane.queued,
                "running": lane.in_flight,
            }
        return {
            **self.stats.snapshot(),
            "active": active,
            "queued": queued,
            "cache": self.cache.snapshot(),
            "models": models,
            "memory": process_memory(),
        }
