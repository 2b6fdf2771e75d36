"""The speech service: every protocol plans a request here and runs it as a `SpeechJob`.

`plan()` checks everything that can be checked before a byte is sent (model, voice, text, speed)
and cuts the text into segments. `speak(plan)` returns the job, to be used as `async with`: the
job owns its request place, lease and engine turn until its engine work has stopped (see
`app.serving.job`). The service keeps the jobs running now, by internal ticket and by the
client's request id, so a cancel by id reaches every request that carries it.

Where the engines run is the service's `renderer` (this process by default) and, on a cluster,
its `fleet` (the engine replicas' reports); `model_views()` reads either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TypeVar

from app.serving import collector, tracing
from app.serving.budgets import (
    AudioLimit,
    OverBudget,
    check_audio,
    env_name,
    seconds,
    speech_floor,
)
from app.serving.cache import AudioCache, open_cache
from app.serving.catalogue import LanguageModels
from app.serving.fleet import (
    DeploymentStatus,
    Fleet,
    ModelView,
    ReplicaState,
    fleet_views,
    local_views,
)
from app.serving.job import JobContext, SpeechJob
from app.serving.lexicons import LexiconLimits, LexiconStore
from app.serving.memory import process_memory
from app.serving.metrics import Metrics, registry_voice_ids
from app.serving.plan import CutRecord, Speaker, SpeechPlan
from app.serving.record import RenderRecord
from app.serving.render import LocalRenderer, Renderer
from app.serving.scheduler import Lane
from app.serving.tracking import RequestRecord, ServingStats
from app.settings import Settings
from app.text.feed import TextFeed
from app.text.language import language_of
from app.text.lexicon import Lexicon
from app.text.prepared import Cut, Prepared, cut, prepare
from app.text.split import first_sentence, segment_offsets, split_text
from app.text.ssml import detect
from engines.base import (
    InvalidParameter,
    ModelNotFound,
    Placed,
    SynthesisRequest,
    TimedEngine,
    VoiceNotFound,
)
from engines.frontend.detect import split_runs
from engines.frontend.ipa import unsayable
from engines.registry import EngineRegistry, ModelHandle, ModelStatus, SwitchResult

log = logging.getLogger(__name__)
T = TypeVar("T")

WARM_UP_TEXT = "Ready."


_TAG = re.compile(r"<[^>]*>")
MAX_VOICE_CHARS = 200
"""Longest voice a request names (a Kokoro blend of ten voices fits): it is echoed in
`X-VoxMux-Voice`, and each part of a blend is checked."""
EXPANSION = 4
"""What SSML and lexicons make of an input may be this many times longer than its limit."""
THREAD_CHARS = 20_000
"""Texts longer than this (a book's chapter) are cut in a worker thread: cutting two million
characters takes seconds."""


async def _off_loop(chars: int, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)`, in a worker thread when the text is long."""
    if chars > THREAD_CHARS:
        return await asyncio.to_thread(work, *args)
    return work(*args)


def split_speed(speed: float, native: tuple[float, float]) -> tuple[float, float]:
    """Speed -> (engine-native part, residual pitch-preserving time-stretch factor)."""
    low, high = native
    inside = min(max(speed, low), high)
    return inside, speed / inside


class SpeechService:
    def __init__(self, settings: Settings, registry: EngineRegistry[Lane], *,
                 cache: AudioCache | None = None, stats: ServingStats | None = None,
                 renderer: Renderer | None = None, fleet: Fleet | None = None,
                 languages: LanguageModels | None = None) -> None:
        self.settings = settings
        self.languages = languages
        """Which model speaks each language for OpenAI's model names (`_route`)."""
        self.registry = registry
        """Every model's handle: catalogue entry and engine adapter (planning, voices); on a
        cluster the engines are loaded on the replicas, never here."""
        self.cache = cache or open_cache(
            settings.cache_url, settings.cache_max_items, settings.cache_max_bytes,
            settings.cache_max_item_bytes,
        )
        self.renderer = renderer or LocalRenderer(registry, settings.request_timeout)
        self.lexicons = LexiconStore(settings.lexicons_dir, settings.lexicon_path, LexiconLimits(
            settings.lexicons_max_per_owner, settings.lexicon_max_entries,
            settings.lexicons_max_entries_per_owner))
        self.fleet = fleet
        self.stats = stats or ServingStats(settings.request_log_size, settings.stats_window)
        self.metrics = Metrics(registry_voice_ids(registry))  # bounded `voice` labels
        registry.on_change.append(self._observe_load)
        self._jobs: dict[str, SpeechJob] = {}
        """Running jobs by ticket."""
        self._by_request_id: dict[str, set[str]] = defaultdict(set)
        self._context = JobContext(self.renderer, self.cache, self.render_record,
                                   settings.sentence_pause_ms, settings.stream_buffer_seconds,
                                   self._started, self._finished,
                                   None if fleet is not None else self._ready)

    async def _ready(self, model_id: str) -> None:
        """`model_id` loaded (a lease taken and let go: its idle timer runs as after a
        request); a load failure is raised here."""
        async with self.registry.lease(model_id):
            pass

    def close(self) -> None:
        """At shutdown: no new engine calls; one still running finishes in its thread."""
        for handle in self.registry.handles():
            handle.lane.close()
        self.lexicons.close()

    # -- models ------------------------------------------------------------------------------

    async def replicas(self) -> list[ReplicaState] | None:
        """The engine replicas' reports on a cluster; None in a single process."""
        return await self.fleet.replicas() if self.fleet is not None else None

    async def model_views(self, replicas: list[ReplicaState] | None = None
                          ) -> dict[str, ModelView]:
        """Each model's state: this process's registry and lanes, or the cluster's replicas."""
        if self.fleet is None:
            return local_views(self.registry.handles())
        if replicas is None:
            replicas = await self.fleet.replicas()
        return fleet_views([h.id for h in self.registry.handles()], replicas,
                           self.fleet.routing())

    async def load_model(self, model_id: str) -> None:
        if self.fleet is not None:
            await self.fleet.load(model_id, self.registry[model_id].entry.default_voice)
        else:
            await self.registry.load(model_id)

    async def unload_model(self, model_id: str) -> bool:
        self.local_only("unloaded")
        return await self.registry.unload(model_id)

    async def switch_model(self, model_id: str, unload_previous: bool) -> SwitchResult:
        self.local_only("switched")
        return await self.registry.switch(model_id, unload_previous=unload_previous)

    def local_only(self, done: str) -> None:
        """Refuse an operation on a model that only a single process can do on request."""
        if self.fleet is not None:
            raise InvalidParameter(
                f"On a cluster, models are placed and {done} by the engine replicas "
                "(Serve's multiplexing, VOXMUX_RAY_MODELS_PER_REPLICA), not on request",
                param="model", code="cluster_managed",
            )

    def models(self) -> list[ModelHandle[Lane]]:
        return self.registry.handles()

    def resolve_voice(self, handle: ModelHandle[Lane], voice: str | None) -> str:
        """The model's voice id for what a request named: its default for nothing, an OpenAI
        or operator alias through the model's map, unless the model has a voice of that very
        name (hibari's `fable` once its file is installed), which wins."""
        entry = handle.entry
        if not voice:
            return entry.default_voice
        if voice not in entry.voice_map or any(v.id == voice for v in handle.engine.voices()):
            return voice
        return entry.voice_map[voice]

    def named_voice(self, name: str) -> tuple[str, str | None]:
        """(model, voice) for a voice named across models, as the Wyoming and ElevenLabs
        protocols name them: `model:voice`, a model (its default voice, None here), or a voice
        id only one model has (the first model listing it); `VoiceNotFound` otherwise."""
        model, colon, voice = name.strip().partition(":")
        if colon:
            return model, voice or None
        with contextlib.suppress(ModelNotFound):
            return self.registry.resolve(model).id, None
        for handle in self.registry.handles():
            if any(v.id == model for v in handle.engine.voices()):
                return handle.id, model
        raise VoiceNotFound(f"No model has a voice '{name}'; name it model:voice "
                            "(GET /v1/audio/voices lists them)", param="voice")

    # -- planning ----------------------------------------------------------------------------

    @tracing.traced("plan", SpeechPlan.traced)
    async def plan(self, *, model: str, text: str, voice: str | None = None, speed: float = 1.0,
                   language: str | None = None, instructions: str | None = None,
                   request_id: str | None = None, internal: bool = False,
                   timestamps: bool = False, whole: bool = False, client: str = "",
                   input_format: str | None = None, report: bool = False,
                   long: bool = False) -> SpeechPlan:
        """A request checked against the model, its engine and the limits, cut into segments:
        the one preparation step of every route, protocol and long-form job.

        `whole`: the client gets nothing before the whole clip is made (a route that answers
        with one file), so no segment is kept short for early audio: every one is packed up to
        the engine's limit, which takes fewer engine calls.

        `input_format`: `ssml`, `text`, or None to detect `<speak>`; SSML is compiled and the
        caller's lexicons applied (`app.text.prepared`); `report`: the plan keeps what each
        span was read as.

        `long`: an item of long-form work (a job's chapter, a large batch's item): any length,
        packed like a whole file up to `jobs_segment_chars`, word timings where the engine has
        them, never cached, its segments yielding the engine to interactive requests; its audio
        counts against the job's budget, not a request's. What the preparation made is kept
        with the job (`SpeechPlan.cut_record`) and a part of it rendered later is planned from
        that (`replan`), never prepared again."""
        ssml = detect(text, input_format)
        if not ssml and not any(ch.isalnum() for ch in text):
            raise InvalidParameter(
                "'input' must contain text to speak (letters or digits)", param="input"
            )
        limit = self.settings.max_input_chars
        if len(text) > limit and not long:
            raise InvalidParameter(
                f"'input' is {len(text)} characters; the limit is {limit}",
                param="input", code="string_above_max_length",
            )
        asked, asked_voice = model, voice
        model, voice, language = await self._route(model, text, voice, language, ssml)
        if long:
            timestamps = isinstance(self.registry.resolve(model).engine, TimedEngine)
        plan = self._plan(model, text, voice, speed, language, instructions, request_id,
                          timestamps)
        if model != asked:  # one of OpenAI's names: it spoke the text's language
            plan.routed, plan.asked_voice = asked, asked_voice
        plan.internal = internal
        plan.client = client
        plan.report = report
        plan.background, plan.cacheable = long, not long
        most = self.settings.jobs_segment_chars if long else None

        def split(piece: str) -> list[str]:
            return self.cut(plan, piece, whole=whole or long, most=most)

        self._validate_voice(plan, "Hello.")
        if not (internal or ssml or plan.routed):
            self._check_script(plan, text)
        lexicon = None if internal else await self.lexicons.lexicon(
            client, language or self._voice_language(plan), plan.model_id, plan.voice)
        if ssml or lexicon:  # (what they make can be far longer than what was sent)
            prepared, pieces, unsaid = await asyncio.to_thread(
                self._prepare, plan, text, ssml, lexicon, split, long)
            plan.text, plan.prepared = prepared.text, prepared
            plan.segments, plan.offsets = pieces.segments, pieces.offsets
            plan.pauses, plan.rates = pieces.pauses, pieces.rates
            plan.pitches = pieces.pitches
            plan.speakers = self._speakers(plan, pieces.voices, pieces.languages)
            plan.warnings += [*prepared.compiled.warnings, *unsaid]
        else:
            plan.segments = await _off_loop(len(text), split, text)
            plan.offsets = segment_offsets(text, plan.segments)
        self._validate_voice(plan, plan.segments[0])
        if not internal:
            spoken = plan.text if isinstance(plan.text, str) else text
            await _off_loop(len(spoken), self._check_costs, plan, spoken)
        return plan

    def replan(self, *, model: str, text: str, record: CutRecord, end: int, start: int,
               voice: str | None = None, speed: float = 1.0, language: str | None = None,
               instructions: str | None = None, request_id: str | None = None,
               client: str = "") -> SpeechPlan:
        """Segments `start` to `end` of a long-form item planned before (`plan(long=True)`),
        from the cut it made then (`record`): a resumed or parallel part renders exactly the
        segments planned, joined as the whole would be, whatever lexicons or settings say now.
        """
        handle = self.registry.resolve(model)
        plan = self._plan(model, text, voice, speed, language, instructions, request_id,
                          timestamps=isinstance(handle.engine, TimedEngine))
        plan.client = client
        plan.background, plan.cacheable = True, False
        record.apply(plan, end, self._stored_speaker)
        plan.start = start
        self._validate_voice(plan, plan.segments[0])
        return plan

    def _stored_speaker(self, plan: SpeechPlan, model: str, voice: str, language: str | None
                        ) -> Speaker:
        handle = self.registry[model]
        native, stretch = split_speed(plan.speed, handle.engine.capabilities.speed_range)
        return Speaker(handle, voice, native, stretch, language)

    def _prepare(self, plan: SpeechPlan, text: str, ssml: bool, lexicon: Lexicon | None,
                 split: Callable[[str], list[str]], long: bool) -> tuple[Prepared, Cut, list[str]]:
        """SSML compiled and the lexicon applied, checked, cut; and what the engine cannot say
        of the readings. Blocking (a worker thread): a 4,096-character input whose words a
        lexicon reads as 200 characters each made 420,000 characters to cut and check."""
        prepared = prepare(text, input_format="ssml" if ssml else "text", lexicon=lexicon)
        if not any(ch.isalnum() for ch in prepared.text):
            raise InvalidParameter("the SSML has no text to speak (letters or digits)",
                                   param="input")
        limit = EXPANSION * (self.settings.jobs_max_chars if long
                             else self.settings.max_input_chars)
        if len(prepared.text) > limit:
            field = "jobs_max_chars" if long else "max_input_chars"
            raise OverBudget("The input as its SSML and lexicons read it",
                             f"{len(prepared.text):,} characters",
                             f"{limit:,} characters ({EXPANSION} times the input's limit)",
                             env_name(field))
        self._check_silence(prepared)
        pieces = cut(prepared, split)
        phoneme_set = getattr(plan.engine, "phoneme_set", None)
        unsaid = unsayable(prepared.text, phoneme_set) if phoneme_set is not None else []
        return prepared, pieces, unsaid

    def _check_silence(self, prepared: Prepared) -> None:
        """The silence the SSML breaks ask for in all, against its budget."""
        asked = sum(prepared.compiled.breaks.values())
        limit = self.settings.max_ssml_silence_seconds
        if asked > limit:
            raise OverBudget("The silence its SSML breaks ask for", seconds(asked),
                             seconds(limit), env_name("max_ssml_silence_seconds"))

    def _check_costs(self, plan: SpeechPlan, spoken: str) -> None:
        """Costs the input shows before any audio is made: the audio it makes at least (its
        breaks, and its letters read faster than any voice reads them) against the request's
        audio budget, and the normalization report against the size of a response header."""
        settings = self.settings
        breaks = sum(plan.prepared.compiled.breaks.values()) if plan.prepared else 0.0
        plan.least_seconds = breaks + speech_floor(spoken, plan.speed)
        if not plan.background:  # (long-form work counts against its job's budget)
            check_audio(plan.least_seconds, settings.max_audio_seconds, "max_audio_seconds",
                        "The input")
            plan.audio_limit = AudioLimit(settings.max_audio_seconds)
        if plan.report and plan.prepared is not None:
            size = len(json.dumps(plan.prepared.report, separators=(",", ":")))
            limit = settings.max_response_header_bytes
            if size > limit:
                raise OverBudget("Its normalization report", f"{size:,} bytes",
                                 f"{limit:,} bytes a response header",
                                 env_name("max_response_header_bytes"),
                                 param="normalization_report",
                                 hint="ask without the report, or for a shorter input")

    def _speakers(self, plan: SpeechPlan, voices: dict[int, str], languages: dict[int, str]
                  ) -> dict[int, Speaker]:
        """Who reads each segment SSML gives another voice or language, checked now: a voice
        no model has is a 400; a language the engine cannot read is a warning (the segment is
        read in its voice's own language)."""
        speakers: dict[int, Speaker] = {}
        named = {name: self._ssml_voice(plan, name) for name in set(voices.values())}
        unread: set[str] = set()
        for index in sorted({*voices, *languages}):
            handle, voice = named[voices[index]] if index in voices else (plan.handle,
                                                                          plan.voice)
            if plan.timestamps and not isinstance(handle.engine, TimedEngine):
                raise InvalidParameter(
                    f"The {handle.id} engine (an SSML <voice>) reports no word timings; ask "
                    "without timestamps", param="timestamps", code="timestamps_unsupported")
            language = languages.get(index, plan.language)
            if plan.routed and index not in voices and language and self.languages:
                # OpenAI's names: a <lang> stretch is read by that language's model.
                handle = self.registry[self.languages.model_for(language)]
                voice = self.resolve_voice(handle, plan.asked_voice)
                language = self._told(handle.id, language)
            native, stretch = split_speed(plan.speed, handle.engine.capabilities.speed_range)
            speaker = Speaker(handle, voice, native, stretch, language)
            if speaker.language != plan.language and not self._speaks(plan, speaker):
                warning = (f"<lang xml:lang=\"{speaker.language}\"> is not read by the "
                           f"{handle.id} engine with voice {voice}; read in the voice's own "
                           "language")
                if warning not in unread:
                    unread.add(warning)
                    plan.warnings.append(warning)
                speaker = Speaker(handle, voice, native, stretch, plan.language)
            if speaker != plan.speaker:
                speakers[index] = speaker
        self._check_switched(plan, {s.handle for s in speakers.values()} - {plan.handle})
        return speakers

    async def _route(self, model: str, text: str, voice: str | None, language: str | None,
                     ssml: bool) -> tuple[str, str | None, str | None]:
        """(model, voice, language) that speak a request: as asked, but for OpenAI's model
        names, which speak the language they are given. A voice id only one model has is
        spoken by that model; else the catalogue's model for the request's `language`, or the
        input's (`app.text.language`), speaks it, with the OpenAI voice name mapped onto it."""
        table = self.languages
        if table is None or model.strip() not in table.names:
            return model, voice, language
        owners = [h.id for h in self.registry.handles()
                  if voice and any(v.id == voice for v in h.engine.voices())]
        if len(owners) == 1:
            return owners[0], voice, language
        if language:
            spoken = language
        else:
            spoken = await asyncio.to_thread(language_of, _TAG.sub(" ", text) if ssml else text)
        target = table.model_for(spoken)
        return target, voice, language or self._told(target, spoken)

    def _told(self, model: str, language: str) -> str | None:
        """The language a routed model is told to read: none for the model chosen for that
        very language (it reads in its voices' own), the language for the model of the rest."""
        table = self.languages
        base = language.split("-")[0].lower()
        return None if table is not None and table.models.get(base) == model else language

    def _check_script(self, plan: SpeechPlan, text: str) -> None:
        """A model asked for by its own id refuses text in a script it cannot read (it would
        say nothing of it), naming the languages it reads and a model that reads this one."""
        readable = {code.split("-")[0] for code in plan.engine.capabilities.languages}
        if not readable:
            return
        for run in split_runs(text, self._voice_language(plan), plan.language):
            base = run.language.split("-")[0]
            if base in readable or not any(c.isalpha() for c in run.text):
                continue
            others = [h.id for h in self.registry.handles() if base in {
                code.split("-")[0] for code in h.engine.capabilities.languages}]
            suggestion = (f"ask for {others[0]}, or for tts-1, which picks the model by the "
                          "text's language") if others else "no model here reads it"
            raise InvalidParameter(
                f"The {plan.model_id} model reads {', '.join(sorted(readable))}; this input has "
                f"{base} text ({run.text.strip()[:20]!r}): {suggestion}", param="input",
                code="unsupported_language")

    def _check_switched(self, plan: SpeechPlan, handles: set[ModelHandle[Lane]]) -> None:
        """Refuse now, with a 429 before a byte is sent, a switch to a model that takes no new
        request from this client: its run would wait for a place behind the client's own
        requests. (A model that cannot load fails the job before its first byte: `_ready`.)"""
        if self.fleet is not None or plan.background:  # Serve admits on a cluster; a job's
            return  # parts are admitted as they render (and wait when a model is full)
        for handle in sorted(handles, key=lambda h: h.id):
            handle.lane.admit(plan.client)

    def _ssml_voice(self, plan: SpeechPlan, name: str) -> tuple[ModelHandle[Lane], str]:
        """The model and voice `<voice name>` means: a voice of the request's model, a model
        (its default voice), `model:voice`, or a voice id only one other model has."""
        voice = self.resolve_voice(plan.handle, name)
        if self._speaks(plan, Speaker(plan.handle, voice, 1.0, 1.0, None)):
            return plan.handle, voice
        model, colon, voice = name.partition(":")
        with contextlib.suppress(ModelNotFound):
            handle = self.registry.resolve(model)
            voice = self.resolve_voice(handle, voice if colon else None)
            if self._speaks(plan, Speaker(handle, voice, 1.0, 1.0, None)):
                return handle, voice
        for handle in self.registry.handles():
            if handle is not plan.handle and any(v.id == name for v in handle.engine.voices()):
                return handle, name
        raise VoiceNotFound(
            f"SSML <voice name=\"{name}\">: no model has that voice; name a voice of "
            f"{plan.model_id}, a model, or model:voice (GET /v1/audio/voices lists them)",
            param="input")

    @staticmethod
    def _speaks(plan: SpeechPlan, speaker: Speaker) -> bool:
        """Whether the speaker's engine takes its voice and language."""
        try:
            speaker.engine.validate(SynthesisRequest(
                text="Hello.", voice=speaker.voice, speed=speaker.native_speed,
                language=speaker.language, timings=plan.timestamps))
        except (VoiceNotFound, InvalidParameter):
            return False
        return True

    def cut(self, plan: SpeechPlan, text: str, *, whole: bool = True,
            most: int | None = None) -> list[str]:
        """`text` in the segments `plan`'s engine is given, each at most `most` characters (and
        never over the engine's limit)."""
        capabilities = plan.engine.capabilities
        limit = capabilities.max_segment_chars
        most = min(most, limit) if most else limit
        first = most if whole else self.settings.first_segment_chars
        if capabilities.whole_first_sentence and first < most:
            first = max(first, len(first_sentence(text, most)))
        return split_text(text, max_chars=most, first_max_chars=first,
                          growth=self._growth(plan))

    def _growth(self, plan: SpeechPlan) -> float:
        """How much each segment's budget grows over the one before (`segment_packing`): a
        model on a device packs every segment after the first up to the engine's limit."""
        packing = self.settings.segment_packing
        if packing == "auto":
            packing = "full" if self._on_device(plan) else "grow"
        return math.inf if packing == "full" else self.settings.segment_growth

    def _on_device(self, plan: SpeechPlan) -> bool:
        """Whether `plan`'s model runs on a device: by the providers its sessions run on, or,
        while it is not loaded (a request planned before its load, a cluster's ingress, which
        loads none), by those it is configured for. An engine that runs on no onnxruntime
        provider (eSpeak NG) runs on the CPU."""
        if not isinstance(plan.engine, Placed):
            return False
        providers = plan.handle.providers or tuple(self.settings.providers_for(plan.model_id))
        return bool(providers) and providers[0] != "CPUExecutionProvider"

    def _voice_language(self, plan: SpeechPlan) -> str:
        for voice in plan.engine.voices():
            if voice.id == plan.voice and voice.language:
                return voice.language
        return "en"

    def plan_stream(self, *, model: str, voice: str | None = None, speed: float = 1.0,
                    language: str | None = None, instructions: str | None = None,
                    request_id: str | None = None, timestamps: bool = False,
                    client: str = "", input_format: str | None = None,
                    report: bool = False) -> SpeechPlan:
        """A text-in request: options checked now (on a probe sentence), text fed later. SSML
        needs the whole document, so a text-in session refuses it."""
        if input_format == "ssml":
            raise InvalidParameter("SSML needs the whole document in one request; text-in "
                                   "sessions take plain text", param="input_format")
        plan = self._plan(model, "", voice, speed, language, instructions, request_id,
                          timestamps)
        plan.client = client
        plan.text = TextFeed(
            max_chars=min(plan.engine.capabilities.max_segment_chars,
                          self.settings.max_input_chars),
            first_max_chars=self.settings.first_segment_chars,
            max_pending=self.settings.ws_max_pending_chars,
        )
        self._validate_voice(plan, "Hello.")
        plan.audio_limit = AudioLimit(self.settings.max_audio_seconds)
        return plan

    def _plan(self, model: str, text: str, voice: str | None, speed: float,
              language: str | None, instructions: str | None, request_id: str | None,
              timestamps: bool = False) -> SpeechPlan:
        handle = self.registry.resolve(model)
        if timestamps and not isinstance(handle.engine, TimedEngine):
            raise InvalidParameter(
                f"The {handle.id} engine reports no word timings; ask without timestamps",
                param="timestamps", code="timestamps_unsupported",
            )
        if not 0.25 <= speed <= 4.0:
            raise InvalidParameter("'speed' must be between 0.25 and 4.0", param="speed")
        if voice is not None and len(voice) > MAX_VOICE_CHARS:
            raise InvalidParameter(f"'voice' is {len(voice):,} characters; a voice id or blend is "
                                   f"at most {MAX_VOICE_CHARS}", param="voice")
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
            timestamps=timestamps,
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
            text=sample, voice=plan.voice, speed=plan.native_speed, language=plan.language,
            timings=plan.timestamps,
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

    def render_record(self, plan: SpeechPlan) -> RenderRecord:
        """What shapes `plan`'s audio: its cache key, and the check that a result is current."""
        return RenderRecord.of(
            model=plan.model_id, engine=plan.engine, voice=plan.voice,
            native_speed=plan.native_speed, stretch=plan.stretch, language=plan.language,
            segments=plan.segments, pause_ms=self.settings.sentence_pause_ms,
            pauses=plan.pauses, rates=plan.rates, pitches=plan.pitches,
            speakers=plan.speakers,
        )

    def cancel(self, request_id: str) -> int:
        """Cancel every running request that carries `request_id`; how many there were."""
        jobs = [self._jobs[t] for t in self._by_request_id.get(request_id, ()) if t in self._jobs]
        for job in jobs:
            job.cancel()
        return len(jobs)

    async def cancel_everywhere(self, request_id: str) -> int:
        """`cancel` here and, on a cluster, on every other ingress replica."""
        cancelled = self.cancel(request_id)
        if self.fleet is not None:
            cancelled += await self.fleet.cancel(request_id)
        return cancelled

    def running(self) -> list[SpeechJob]:
        return list(self._jobs.values())

    def queue_position(self, record: RequestRecord) -> int | None:
        return self.registry[record.model].lane.position(record.ticket)

    async def warm_up(self, model_id: str) -> None:
        """One short synthesis so the first real request pays no first-run cost."""
        plan = await self.plan(model=model_id, text=WARM_UP_TEXT, internal=True)
        async with self.speak(plan) as job:
            await job.whole()

    async def invalidate_model(self, model_id: str) -> int:
        """Forget a model's cached audio; call when its voices or weights changed (rescan)."""
        dropped = await self.cache.clear_model(model_id)
        if dropped:
            log.info("cache: dropped %d entries of %s", dropped, model_id)
        return dropped

    def _observe_load(self, model_id: str, status: ModelStatus) -> None:
        if status is ModelStatus.READY:
            if self.settings.gc_freeze:  # a model loaded while serving: out of sight too
                collector.settle()
            seconds = self.registry[model_id].load_seconds
            if seconds is not None:
                self.metrics.load_seconds.labels(model_id).observe(seconds)

    # -- reporting ---------------------------------------------------------------------------

    async def report(self) -> dict[str, object]:
        """The body of `GET /stats`."""
        replicas = await self.replicas()
        views = await self.model_views(replicas)
        models: dict[str, object] = {}
        for model_id, view in views.items():
            models[model_id] = {
                "status": view.status,
                "refcount": view.refcount,
                "load_seconds": view.load_seconds,
                "active": view.running,
                "queued": view.queued,
                "running": view.in_flight,
                "providers": list(view.providers),
            }
            if view.replicas is not None:
                models[model_id]["replicas"] = list(view.replicas)  # type: ignore[index]
        report: dict[str, object] = {
            **self.stats.snapshot(),
            "active": sum(v.running for v in views.values()),
            "queued": sum(v.queued for v in views.values()),
            "cache": asdict(await self.cache.snapshot()),
            "models": models,
            "memory": process_memory(),
        }
        if self.fleet is not None and replicas is not None:
            report["cluster"] = cluster_report(replicas, await self.fleet.deployment(),
                                               self.shared_state())
        return report

    def shared_state(self) -> dict[str, object]:
        """On a cluster: what the ingress replicas share, and what takes Redis to share."""
        redis = bool(self.settings.cache_url)
        alone = "only the ingress replica that answered (needs Redis: VOXMUX_CACHE_URL)"
        return {
            "redis": redis,
            "audio_cache": "every ingress replica" if redis else alone,
            "studio_clips": "every ingress replica" if redis else alone,
            "cancel_by_id": ("every ingress replica"
                             if self.fleet is not None and self.fleet.shared_cancel else alone),
        }

    async def metrics_text(self) -> bytes:
        """`GET /metrics`: the counters of this process, levels from wherever engines run."""
        replicas = await self.replicas()
        views = await self.model_views(replicas)
        return self.metrics.render(views, await self.cache.snapshot(), replicas)


def cluster_report(replicas: list[ReplicaState], deployment: DeploymentStatus,
                   shared: dict[str, object]) -> dict[str, object]:
    """The engine deployment as Serve sees it, which replica holds which model, and what the
    ingress replicas share."""
    return {
        "deployment": asdict(deployment),
        "shared": shared,
        "replicas": [
            {
                "id": r.id,
                "node": r.node,
                "preloading": r.preloading,
                "updated": r.updated,
                "holds": r.holds,
                "models": {m: asdict(s) for m, s in r.models.items()},
            }
            for r in replicas
        ],
    }
