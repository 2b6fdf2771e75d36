"""What the Studio shows: models, voice groups, and the clips it synthesizes for its player.

Everything here reads the same speech service, registry and stats the API routes use; the Studio
never calls the API over HTTP.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from cachetools import TTLCache
from starlette.requests import Request

from app.audio.encoders import CONTENT_TYPES, encode_whole
from app.protocols.native import whole_timed
from app.protocols.timestamps import captions, word_json
from app.serving.fleet import ModelView
from app.serving.service import SpeechService
from engines.base import InvalidParameter, TimedEngine, Voice
from engines.frontend.detect import language_matches

FORMATS = ("mp3", "opus", "aac", "flac", "wav")
"""Formats the Studio offers: raw `pcm` is left out because no browser can play it."""
RECENT_LIMIT = 8
"""Voices kept in the "last used" group (the list itself lives in the browser)."""
GENDERS = ("female", "male", "unknown")
KINDS = {"neural": "Neural", "rule-based": "Rule-based"}
"""How a model makes speech (`Capabilities.neural`): neural voices are listed first."""
OPEN_GROUPS_UP_TO = 40
"""Language groups start open when no more voices of their kind than this match."""


def voice_key(model: str, voice: str) -> str:
    return f"{model}:{voice}"


def parse_keys(raw: str, limit: int = 200) -> list[tuple[str, str]]:
    """`model:voice,model:voice` from the browser's localStorage -> pairs, deduplicated."""
    pairs: list[tuple[str, str]] = []
    for item in raw.split(","):
        model, sep, voice = item.strip().partition(":")
        if sep and model and voice and (model, voice) not in pairs:
            pairs.append((model, voice))
    return pairs[:limit]


@dataclass(frozen=True)
class Filters:
    model: str = ""
    language: str = ""
    """A language code, matched as `GET /v1/audio/voices` does: `en` takes en-us and en-gb."""
    gender: str = ""
    """`female`, `male`, `unknown` (not stated) or empty for any."""
    query: str = ""
    kind: str = ""
    """`neural`, `rule-based` (see `KINDS`) or empty for any."""

    def matches(self, voice: Voice, kind: str = "") -> bool:
        """Whether `voice`, made by a model of `kind`, passes every filter."""
        if self.model and voice.model != self.model:
            return False
        if self.kind and kind != self.kind:
            return False
        if self.language and not language_matches(voice.language, self.language):
            return False
        if self.gender and (voice.gender or "unknown") != self.gender:
            return False
        needle = self.query.strip().casefold()
        haystack = f"{voice.id} {voice.name} {voice.language} {voice.model}".casefold()
        return all(word in haystack for word in needle.split())


@dataclass(frozen=True)
class VoiceGroup:
    key: str
    title: str
    voices: list[Voice]
    kind: str = ""
    """The kind of model its voices come from; empty for the pinned groups (any kind)."""
    open: bool = True


@dataclass(frozen=True)
class VoiceView:
    groups: list[VoiceGroup]
    matched: int
    total: int
    favourites: frozenset[str]
    compared: frozenset[str] = frozenset()
    """Voices in the comparison (`model:voice`)."""
    neural: int = 0
    """How many of the matched voices are neural."""


def all_voices(service: SpeechService) -> list[Voice]:
    return [v for handle in service.models() for v in handle.engine.voices()]


def named_voices(service: SpeechService, pairs: list[tuple[str, str]],
                 voices: list[Voice] | None = None) -> list[Voice]:
    """The voices `pairs` (model, voice) name, of models that exist. A voice may be a blend or
    an alias that no listing holds: it is shown by the name it was given."""
    known = {voice_key(v.model, v.id): v for v in voices or all_voices(service)}
    return [known.get(voice_key(m, v)) or Voice(id=v, name=v, model=m) for m, v in pairs
            if m in service.registry]


def model_kinds(service: SpeechService) -> dict[str, str]:
    """Each model's kind (a key of `KINDS`), from its engine's capabilities."""
    return {h.id: "neural" if h.engine.capabilities.neural else "rule-based"
            for h in service.models()}


def language_names(voices: list[Voice]) -> dict[str, str]:
    """Readable names of language codes, taken from voices named after their language (eSpeak's)."""
    return {v.language: v.name.replace("_", " ") for v in voices if v.id == v.language}


def language_label(code: str, names: dict[str, str]) -> str:
    if not code:
        return "Language not stated"
    name = names.get(code)
    return f"{name} ({code})" if name and name != code else code


def languages(voices: list[Voice]) -> list[tuple[str, str]]:
    """(code, label) of every language spoken by some voice, sorted by label."""
    names = language_names(voices)
    codes = {v.language for v in voices if v.language}
    return sorted(((c, language_label(c, names)) for c in codes), key=lambda p: p[1].casefold())


def voice_view(service: SpeechService, filters: Filters, favourites: list[tuple[str, str]],
               recent: list[tuple[str, str]],
               compared: list[tuple[str, str]] | None = None) -> VoiceView:
    """Favourites and the last used first, then the voices by language: every neural language
    group before the rule-based ones, so that a model's few natural voices are not buried under
    eSpeak NG's 140 languages."""
    voices = all_voices(service)
    kinds = model_kinds(service)

    def pick(pairs: list[tuple[str, str]]) -> list[Voice]:
        return [v for v in named_voices(service, pairs, voices)
                if filters.matches(v, kinds[v.model])]

    matched = [v for v in voices if filters.matches(v, kinds[v.model])]
    names = language_names(voices)
    by_language: dict[tuple[str, str], list[Voice]] = {}
    for voice in matched:
        by_language.setdefault((kinds[voice.model], voice.language), []).append(voice)
    per_kind = {kind: sum(len(g) for (k, _), g in by_language.items() if k == kind)
                for kind in KINDS}
    groups = [
        VoiceGroup("favourites", "Favourites", pick(favourites)),
        VoiceGroup("recent", "Last used", pick(recent[:RECENT_LIMIT])),
    ]
    groups += sorted(
        (VoiceGroup(f"{'lang' if kind == 'neural' else 'rule'}-{code or 'none'}",
                    language_label(code, names), members, kind,
                    open=per_kind[kind] <= OPEN_GROUPS_UP_TO)
         for (kind, code), members in by_language.items()),
        key=lambda g: (list(KINDS).index(g.kind), g.title.casefold()),
    )
    return VoiceView(
        groups=groups,
        matched=len(matched),
        total=len(voices),
        favourites=frozenset(voice_key(m, v) for m, v in favourites),
        compared=frozenset(voice_key(m, v) for m, v in compared or []),
        neural=per_kind["neural"],
    )


@dataclass(frozen=True)
class ModelRow:
    id: str
    engine: str
    description: str
    status: str
    error: str | None
    refcount: int
    load_seconds: float | None
    voices: int
    default_voice: str
    aliases: tuple[str, ...]
    current: bool
    runs_on: str
    """Where the loaded model runs: `CUDA`, `CPU`, ... (its first onnxruntime provider), empty
    while unloaded and for engines that use none."""


def device_name(providers: tuple[str, ...]) -> str:
    """`CUDAExecutionProvider` -> `CUDA`: the provider a model's work goes to first."""
    return providers[0].removesuffix("ExecutionProvider") if providers else ""


def model_rows(service: SpeechService, views: dict[str, ModelView]) -> list[ModelRow]:
    return [
        ModelRow(
            id=handle.id,
            engine=handle.engine.name,
            description=handle.entry.description,
            status=str(views[handle.id].status),
            error=views[handle.id].error,
            refcount=views[handle.id].refcount,
            load_seconds=views[handle.id].load_seconds,
            voices=len(handle.engine.voices()),
            default_voice=handle.entry.default_voice,
            aliases=handle.entry.aliases,
            current=views[handle.id].current,
            runs_on=device_name(views[handle.id].providers),
        )
        for handle in service.models()
    ]


@dataclass(frozen=True)
class Clip:
    id: str
    data: bytes
    format: str
    model: str
    voice: str
    sample_rate: int
    stats: dict[str, object]
    warnings: list[str] = field(default_factory=list)
    text: str = ""
    words: list[dict[str, Any]] = field(default_factory=list)
    """Timed words (`word_json`), for the transcript that highlights the word being heard."""
    srt: str = ""

    @property
    def transcript(self) -> list[tuple[str, dict[str, Any] | None]]:
        """The text in pieces: each timed word with its timing, the text between with None."""
        pieces: list[tuple[str, dict[str, Any] | None]] = []
        position = 0
        for word in self.words:
            if word["char_start"] > position:
                pieces.append((self.text[position:word["char_start"]], None))
            pieces.append((self.text[word["char_start"]:word["char_end"]], word))
            position = max(position, word["char_end"])
        if position < len(self.text):
            pieces.append((self.text[position:], None))
        return pieces

    @property
    def srt_name(self) -> str:
        return self.filename.rsplit(".", 1)[0] + ".srt"

    @property
    def content_type(self) -> str:
        return CONTENT_TYPES[self.format]

    @property
    def filename(self) -> str:
        voice = "".join(c if c.isalnum() or c in "-_" else "_" for c in self.voice)
        return f"voxmux-{self.model}-{voice}.{'ogg' if self.format == 'opus' else self.format}"


class ClipStore(Protocol):
    """Where the Studio keeps the clips it made for its player and download link."""

    async def put(self, clip: Clip) -> bool: ...

    async def get(self, clip_id: str) -> Clip | None: ...


def open_clip_store(url: str | None) -> ClipStore:
    """In this process, or in the shared tier at `url` (`VOXMUX_CACHE_URL`), where every ingress
    replica of a cluster finds the clip another one made."""
    if not url:
        return MemoryClipStore()
    from app.studio.shared_clips import RedisClipStore  # the optional redis client

    return RedisClipStore(url)


class MemoryClipStore:
    """The last clips the Studio made, kept for its player and download link, bounded in bytes."""

    def __init__(self, max_items: int = 32, max_bytes: int = 64 << 20, ttl: float = 3600) -> None:
        self.max_items = max_items
        self._clips: TTLCache[str, Clip] = TTLCache(
            maxsize=max_bytes, ttl=ttl, getsizeof=lambda clip: max(len(clip.data), 1)
        )

    async def put(self, clip: Clip) -> bool:
        if len(clip.data) > self._clips.maxsize:
            return False
        self._clips[clip.id] = clip
        while len(self._clips) > self.max_items:
            self._clips.popitem()
        return True

    async def get(self, clip_id: str) -> Clip | None:
        return self._clips.get(clip_id)

    def __len__(self) -> int:
        return len(self._clips)


def new_clip_id() -> str:
    return secrets.token_urlsafe(12)


async def synthesize(service: SpeechService, *, model: str, text: str, voice: str | None,
                     speed: float, fmt: str, request_id: str, client: str = "",
                     request: Request | None = None) -> Clip:
    """One whole clip through the speech service (planned `whole`: nothing plays before it is
    made, so no segment is kept short), with its words where the engine times them.

    A voice whose engine has no timings for it (a Piper graph without the duration tensor, or
    none could be made) is spoken without them, and the clip says so: the Studio plays every
    voice the API speaks. The engine may only find that out once loaded, so its refusal of
    timestamps is taken at any point of the first try."""
    if fmt not in FORMATS:
        raise InvalidParameter(
            f"The Studio plays {', '.join(FORMATS)}; '{fmt}' is not one of them", param="format"
        )
    timed = isinstance(service.registry.resolve(model).engine, TimedEngine)
    attempt = functools.partial(_clip, service, model=model, text=text, voice=voice,
                                speed=speed, fmt=fmt, request_id=request_id, client=client,
                                request=request)
    try:
        return await attempt(timed=timed)
    except InvalidParameter as exc:
        if not timed or exc.code != "timestamps_unsupported":
            raise
        note = f"No word timings for this voice: {exc.message}. The transcript is not highlighted."
        return await attempt(timed=False, notes=[note])


async def _clip(service: SpeechService, *, model: str, text: str, voice: str | None,
                speed: float, fmt: str, request_id: str, client: str, request: Request | None,
                timed: bool, notes: list[str] | None = None) -> Clip:
    plan = await service.plan(model=model, text=text, voice=voice or None, speed=speed,
                              request_id=request_id, timestamps=timed, whole=True,
                              client=client)
    job = service.speak(plan)
    samples, words = await whole_timed(job, request)
    data = await asyncio.to_thread(encode_whole, samples, job.sample_rate, fmt)
    assert job.stats is not None
    return Clip(
        id=new_clip_id(),
        data=data,
        format=fmt,
        model=plan.model_id,
        voice=plan.voice,
        sample_rate=job.sample_rate,
        stats=job.stats.envelope(),
        warnings=[*plan.warnings, *(notes or [])],
        text=text,
        words=[word_json(w) for w in words],
        srt=captions(text, words, "srt") if words else "",
    )
