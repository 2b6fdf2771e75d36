"""ElevenLabs' text-to-speech API, as its SDKs call it: bodies, `output_format` strings, the
listings' shapes, the error shape, and the with-timestamps answers (base64 audio with the
character `alignment` of the text the client sent).

Voice ids are VoxMux's names across models (`model:voice`, a model, or a voice id one model has;
`SpeechService.named_voice`), or ElevenLabs' own premade ids through the catalogue's
`[elevenlabs_voices]` table (`Rachel`'s `21m00Tcm4TlvDq8ikWAM` is hibari's heart). `model_id`
picks the model when it names one of VoxMux's and the voice id is a bare voice of it;
ElevenLabs' own model ids (`eleven_multilingual_v2`) are accepted and said to be ignored.
`voice_settings.speed` is the speed; the other settings, `seed`, request stitching and
pronunciation dictionary locators do not apply and are named in `X-VoxMux-Warnings`.
`normalized_alignment` is the same as `alignment`: VoxMux's timings always point into the text
as sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from app.http.errors import as_voxmux, error_headers, kind_of
from app.serving.catalogue import ElevenLabsVoice
from app.serving.service import SpeechService
from engines.base import InvalidParameter, ModelNotFound, VoxMuxError

DEFAULT_FORMAT = "mp3_44100_128"
MP3_RATES = (22050, 24000, 44100)
PCM_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
KBPS = (32, 48, 64, 96, 128, 192)


@dataclass(frozen=True)
class OutputFormat:
    fmt: str
    """VoxMux's encoder format (`mp3`, `pcm`, `ulaw`, `opus`)."""
    rate: int
    bit_rate: int | None = None


def output_format(name: str | None) -> OutputFormat:
    """`mp3_44100_128`, `pcm_16000`, `ulaw_8000`, `opus_48000_64`... as exactly that rate and
    encoding; anything else is a 400 naming what is accepted."""
    name = name or DEFAULT_FORMAT
    match = re.fullmatch(r"(mp3|pcm|ulaw|opus)_([1-9][0-9]{3,5})(?:_([1-9][0-9]{1,2}))?", name)
    if match is not None:
        codec, rate, kbps = match[1], int(match[2]), int(match[3]) if match[3] else None
        if codec == "mp3" and rate in MP3_RATES and kbps in KBPS:
            return OutputFormat("mp3", rate, kbps * 1000)
        if codec == "pcm" and rate in PCM_RATES and kbps is None:
            return OutputFormat("pcm", rate)
        if codec == "ulaw" and rate == 8000 and kbps is None:
            return OutputFormat("ulaw", rate)
        if codec == "opus" and rate == 48000 and kbps in KBPS:
            return OutputFormat("opus", rate, kbps * 1000)
    raise InvalidParameter(
        f"output_format '{name}' is not one of mp3_<22050|24000|44100>_<kbps>, "
        f"pcm_<{'|'.join(map(str, PCM_RATES))}>, ulaw_8000, opus_48000_<kbps> "
        f"(kbps {', '.join(map(str, KBPS))})", param="output_format")


HTTP_STATUS = {404: "not_found", 405: "method_not_allowed"}

MEDIA_TYPES = {"mp3": "audio/mpeg", "pcm": "audio/pcm", "ulaw": "audio/basic", "opus": "audio/ogg"}


class VoiceSettings(BaseModel):
    model_config = ConfigDict(extra="allow")

    stability: float | None = None
    similarity_boost: float | None = None
    style: float | None = None
    use_speaker_boost: bool | None = None
    speed: float | None = Field(None, ge=0.25, le=4.0)


class TextToSpeech(BaseModel):
    """The body of `POST /v1/text-to-speech/{voice_id}` and its variants."""

    model_config = ConfigDict(extra="allow")

    text: str = Field(min_length=1)
    model_id: str | None = None
    language_code: str | None = None
    voice_settings: VoiceSettings | None = None
    seed: int | None = None
    previous_text: str | None = None
    next_text: str | None = None
    previous_request_ids: list[str] | None = None
    next_request_ids: list[str] | None = None
    pronunciation_dictionary_locators: list[Any] | None = None

    def unused(self) -> list[str]:
        """What was sent that VoxMux cannot apply."""
        said = [name for name in ("seed", "previous_text", "next_text", "previous_request_ids",
                                  "next_request_ids", "pronunciation_dictionary_locators")
                if getattr(self, name)]
        if self.voice_settings is not None:
            said += [f"voice_settings.{name}" for name, value in self.voice_settings
                     if name != "speed" and value is not None]
        return said


@dataclass(frozen=True)
class Target:
    model: str
    voice: str | None
    warnings: list[str]


def target(service: SpeechService, voice_id: str, body: TextToSpeech) -> Target:
    """The model and voice a request means, and what of it is ignored."""
    warnings: list[str] = []
    model, voice = service.named_voice(voice_id)
    if body.model_id:
        try:
            named = service.registry.resolve(body.model_id).id
        except ModelNotFound:
            warnings.append(f"model_id '{body.model_id}' is not a VoxMux model: the voice's "
                            f"model ({model}) reads it")
        else:
            if ":" not in voice_id and named != model:
                model, voice = named, voice_id
            elif named != model:
                warnings.append(f"model_id '{body.model_id}' ignored: voice '{voice_id}' is "
                                f"{model}'s")
    unused = body.unused()
    if unused:
        warnings.append(f"{', '.join(unused)} ignored: VoxMux has no such control")
    return Target(model, voice, warnings)


def error(exc: BaseException) -> JSONResponse:
    """ElevenLabs' error shape: `{"detail": {"status", "message"}}` (the framework's own 404
    and 405 too)."""
    if isinstance(exc, HTTPException) and not isinstance(exc, VoxMuxError):
        status = HTTP_STATUS.get(exc.status_code, "error")
        return JSONResponse({"detail": {"status": status, "message": str(exc.detail)}},
                            status_code=exc.status_code, headers=exc.headers)
    failure = as_voxmux(exc)
    kind = kind_of(failure)
    return JSONResponse({"detail": {"status": failure.code or kind.code,
                                    "message": failure.message}},
                        status_code=kind.status, headers=error_headers(exc) or None)


def voxmux_name(table: dict[str, ElevenLabsVoice], voice_id: str) -> str:
    """The VoxMux voice an ElevenLabs voice id names: through the alias table, else itself."""
    alias = table.get(voice_id.strip())
    return alias.voice if alias is not None else voice_id


def voice_json(model: str, voice: Any, alias: tuple[str, ElevenLabsVoice] | None = None
               ) -> dict[str, Any]:
    """One voice as ElevenLabs lists it; an alias under its ElevenLabs id and name, saying
    which VoxMux voice speaks it."""
    labels = {"model": model, "language": voice.language or "", "gender": voice.gender or ""}
    voice_id, name = f"{model}:{voice.id}", voice.name
    description = f"{voice.name} on VoxMux's {model} model"
    if alias is not None:
        voice_id, name = alias[0], alias[1].name
        labels["voxmux_voice"] = alias[1].voice
        description = f"ElevenLabs' {name}, spoken by VoxMux's {alias[1].voice}"
    return {"voice_id": voice_id, "name": name, "category": "premade",
            "labels": {k: v for k, v in labels.items() if v},
            "description": description, "preview_url": None,
            "settings": None, "available_for_tiers": [], "high_quality_base_model_ids": [model]}


def find_voice(service: SpeechService, name: str) -> tuple[str, Any] | None:
    """(model, voice) of a VoxMux voice name, None if no model has it."""
    model, voice = service.named_voice(name)
    handle = service.registry.resolve(model)
    wanted = voice or handle.entry.default_voice
    found = next((v for v in handle.engine.voices() if v.id == wanted), None)
    return None if found is None else (handle.id, found)


def voices(service: SpeechService, table: dict[str, ElevenLabsVoice]) -> list[dict[str, Any]]:
    """Every VoxMux voice, then the ElevenLabs ids whose VoxMux voice is installed (each
    model's voices read once)."""
    installed = {f"{h.id}:{v.id}": (h.id, v) for h in service.models() for v in h.engine.voices()}
    listed = [voice_json(model, voice) for model, voice in installed.values()]
    listed += [voice_json(*installed[alias.voice], (voice_id, alias))
               for voice_id, alias in table.items() if alias.voice in installed]
    return listed


PAGE_SIZE = 10
"""`GET /v2/voices`' default page, as ElevenLabs'; at most `MAX_PAGE_SIZE`."""
MAX_PAGE_SIZE = 100


def search_voices(listed: list[dict[str, Any]], params: Any) -> dict[str, Any]:
    """`GET /v2/voices` (the SDK's `voices.search()`): `search` in a voice's id, name,
    description or labels (case-insensitive), `gender`, `language` and `voice_ids` filters,
    `page_size` voices a page, and an opaque `next_page_token` (the next offset) while more
    remain; `InvalidParameter` for a page size or token out of range."""
    def number(name: str, default: int, low: int, high: int) -> int:
        raw = params.get(name)
        try:
            value = default if raw in (None, "") else int(raw)
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise InvalidParameter(f"'{name}' must be a whole number from {low} to {high}",
                                   param=name)
        return value

    size = number("page_size", PAGE_SIZE, 1, MAX_PAGE_SIZE)
    start = number("next_page_token", 0, 0, 1 << 31)
    search = (params.get("search") or "").strip().lower()[:200]
    wanted_ids = set(params.getlist("voice_ids")) if hasattr(params, "getlist") else set()
    found = [v for v in listed
             if (not search or search in json.dumps(
                 [v["voice_id"], v["name"], v["description"], v["labels"]]).lower())
             and (not params.get("gender") or v["labels"].get("gender") == params["gender"])
             and (not params.get("language")
                  or str(v["labels"].get("language", "")).startswith(params["language"]))
             and (not wanted_ids or v["voice_id"] in wanted_ids)]
    page = found[start:start + size]
    more = start + size < len(found)
    return {"voices": page, "has_more": more, "total_count": len(found),
            "next_page_token": str(start + size) if more else None}


def models(service: SpeechService) -> list[dict[str, Any]]:
    out = []
    for handle in service.models():
        languages = sorted({v.language for v in handle.engine.voices() if v.language}
                           or set(handle.engine.capabilities.languages))
        out.append({
            "model_id": handle.id, "name": handle.id, "description": f"VoxMux's {handle.id}",
            "can_do_text_to_speech": True, "can_do_voice_conversion": False,
            "can_use_style": False, "can_use_speaker_boost": False, "can_be_finetuned": False,
            "serves_pro_voices": False, "token_cost_factor": 0.0, "requires_alpha_access": False,
            "maximum_text_length_per_request": service.settings.max_input_chars,
            "languages": [{"language_id": code, "name": code} for code in languages]})
    return out


def user(service: SpeechService) -> dict[str, Any]:
    """Enough of `GET /v1/user` for SDKs and apps that probe it: a local, unmetered account."""
    limit = service.settings.max_input_chars
    return {
        "user_id": "voxmux", "workspace_id": "voxmux", "is_new_user": False,
        "can_use_delayed_payment_methods": False, "is_onboarding_completed": True,
        "is_onboarding_checklist_completed": True, "created_at": 0,
        "seat_type": "workspace_admin", "xi_api_key_preview": None,
        "subscription": {
            "tier": "voxmux-local", "character_count": 0, "character_limit": 10**9,
            "max_character_limit_extension": None, "max_credit_limit_extension": "0",
            "can_extend_character_limit": False, "allowed_to_extend_character_limit": False,
            "voice_slots_used": 0, "professional_voice_slots_used": 0,
            "professional_voice_slots_used_in_workspace": 0,
            "voice_limit": sum(len(h.engine.voices()) for h in service.models()),
            "voice_add_edit_counter": 0,
            "professional_voice_limit": 0, "can_extend_voice_limit": False,
            "can_use_instant_voice_cloning": False, "can_use_professional_voice_cloning": False,
            "current_overage": {"amount": "0", "currency": "usd"}, "status": "active",
            "max_characters_per_request": limit},
    }
