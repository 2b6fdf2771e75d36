"""LunaVox's protocol: its request and stats vocabulary, and its WebSocket framing
(`WS /v1/stream`, `WS /v1/stream/text`) over VoxMux's session loop.

LunaVox's `voice` is a mode, VoxMux's a voice id; one field carries both here. The mode words
`base`, `custom`, `clone` and `design` are modes; anything else is a voice id (mode `custom`).
`base` is the model's default voice, `custom` speaks the voice named by `speaker`; `clone` and
`design` need engines VoxMux does not ship, so they are refused with what is missing. The
sampling fields of LunaVox's autoregressive model mean nothing to these engines: they are
accepted and named as ignored.

On the WebSocket the server sends int16 little-endian mono PCM in binary frames at the engine's
rate, then one text frame `{"done": true, "sample_rate", "stats"}` (the text route adds
`sentences`) and closes with 1000. Nothing else is a text frame: no `started`, no keepalives,
since a LunaVox client takes any text frame for the last one. A bad request closes with 1003 and
the reason, before any audio; a failure once audio is flowing, or one that is not the request's
fault, sends `{"error": "..."}` and then closes (1003 bad request, 1013 overloaded, 1011
otherwise). Protocol limits close with their own code (1008, 1009, 1013) and no frame.
"""


from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket
from pydantic import BaseModel

from app.http.errors import as_voxmux, kind_of
from app.protocols.schemas import StreamFragment, SynthOptions
from app.protocols.websocket import AudioOut, Closing, Command, Progress, parse
from app.serving.events import SegmentEnd, SegmentWords
from app.serving.job import SpeechJob
from app.serving.plan import SpeechPlan
from app.serving.service import SpeechService
from app.serving.tracking import RequestStats
from engines.base import Cancelled, InvalidParameter

MODES = ("base", "custom", "clone", "design")
SAMPLING = (
    "instruct", "reference", "temperature", "top_p", "top_k", "repetition_penalty", "seed"
)
_MISSING = {  # short enough for a WebSocket close reason (123 bytes)
    "clone": "voice=clone needs a voice-cloning engine; none is installed",
    "design": "voice=design needs a voice-design engine; none is installed",
}
_MEMORY = ("rss_start", "rss_end", "rss_peak", "vram_start", "vram_end", "vram_peak")


@dataclass(frozen=True)
class VoiceChoice:
    mode: str
    """`base` or `custom`, as LunaVox reports it."""
    voice: str | None
    """The VoxMux voice id; None for the model's default."""
    ignored: tuple[str, ...]
    """Request fields accepted but without effect, in request-field order."""


def choose_voice(options: SynthOptions) -> VoiceChoice:
    """Mode and voice from `voice` and `speaker`; raises for modes no engine here can serve."""
    given = options.model_fields_set
    ignored = [name for name in SAMPLING if name in given and getattr(options, name) is not None]
    voice, speaker = options.voice_id, options.speaker
    if voice in _MISSING:
        hint = " (use voice=base, or voice=custom with a speaker)"
        raise InvalidParameter(_MISSING[voice] + hint, param="voice", code="unsupported_voice_mode")
    if voice is None or voice == "base":
        if speaker is not None and voice is None:
            return VoiceChoice("custom", speaker, tuple(ignored))
        if speaker is not None:
            ignored.insert(0, "speaker")
        return VoiceChoice("base", None, tuple(ignored))
    if voice == "custom":
        if not speaker:
            raise InvalidParameter(
                "voice=custom needs 'speaker': a voice id (GET /v1/audio/voices lists them)",
                param="speaker",
            )
        return VoiceChoice("custom", speaker, tuple(ignored))
    if speaker is not None and speaker != voice:
        raise InvalidParameter(
            f"'voice' names voice '{voice}' and 'speaker' names '{speaker}'; give one",
            param="speaker",
        )
    return VoiceChoice("custom", voice, tuple(ignored))


async def plan(service: SpeechService, options: SynthOptions, text: str | None,
               request_id: str, client: str, whole: bool = False
               ) -> tuple[SpeechPlan, VoiceChoice]:
    """Plan from LunaVox-style options (`text` None: streamed text follows; `whole`: answered as
    one file, see `SpeechService.plan`); ignored fields also become a warning."""
    choice = choose_voice(options)
    fields: dict[str, Any] = {
        "model": options.model or service.settings.default_model,
        "voice": choice.voice,
        "speed": options.speed,
        "language": options.language,
        "instructions": options.instructions,
        "request_id": request_id,
        "client": client,
    }
    planned = (service.plan_stream(**fields) if text is None
               else await service.plan(**fields, text=text, whole=whole))
    if choice.ignored:
        planned.warnings.append(f"ignored: {', '.join(choice.ignored)} (no sampling engine here)")
    return planned, choice


def stats(record: RequestStats, ignored: tuple[str, ...]) -> dict[str, Any]:
    """LunaVox's stats from VoxMux's record; its numbers are never null (0 where unknown)."""
    mem = record.mem
    return {
        "t_total_ms": record.t_total_ms,
        "audio_duration_ms": record.audio_duration_ms,
        "rtf": record.rtf or 0.0,
        "mem": {f"{name}_bytes": int(getattr(mem, name) or 0) for name in _MEMORY}
        | {"vram_measured": mem.vram_measured},
        "ttfb_ms": record.ttfb_ms,
        "segments": record.segments,
        "ignored": list(ignored),
    }


def synth_stats(job: SpeechJob, n_samples: int, choice: VoiceChoice) -> dict[str, Any]:
    """The `X-Lunavox-Stats` header of `POST /v1/synth`."""
    assert job.stats is not None
    return {
        "sample_rate": job.sample_rate,
        "n_samples": n_samples,
        "mode": choice.mode,
        "stats": stats(job.stats, choice.ignored),
    }


def fragment(payload: dict[str, Any]) -> Command:
    """A frame after the init frame of `WS /v1/stream/text`: text to append, or the end."""
    message = parse(StreamFragment, payload)
    return message.text, "end" if message.end else "text"


class LunaVoxFraming:
    def __init__(self, *, text_in: bool) -> None:
        self.text_in = text_in
        self.choice = VoiceChoice("base", None, ())

    async def plan(self, service: SpeechService, options: BaseModel, text: str | None,
                   request_id: str, client: str) -> SpeechPlan:
        assert isinstance(options, SynthOptions)
        planned, self.choice = await plan(service, options, text, request_id, client)
        return planned

    def audio(self, ws: WebSocket, plan: SpeechPlan) -> AudioOut:
        return AudioOut(ws, plan.sample_rate)

    def started(self, job: SpeechJob) -> None:
        return None

    def segment(self, end: SegmentEnd) -> None:
        return None

    def words(self, words: SegmentWords) -> None:
        return None  # LunaVox has no timestamps: its plans never ask for them

    def keepalive(self, progress: Progress) -> None:
        return None

    def done(self, job: SpeechJob) -> dict[str, Any]:
        assert job.stats is not None
        frame: dict[str, Any] = {"done": True, "sample_rate": job.sample_rate}
        if self.text_in:
            frame["sentences"] = job.segments
        return frame | {"stats": stats(job.stats, self.choice.ignored)}

    def failure(self, exc: BaseException, job: SpeechJob | None, audio_sent: bool) -> Closing:
        kind = kind_of(exc)
        message = as_voxmux(exc).message
        if kind.breach is not None:
            return Closing(None, kind.lunavox_close, message)
        if isinstance(exc, Cancelled):
            return Closing({"error": "The request was cancelled"}, 1000, "cancelled")
        if kind.lunavox_close == 1003 and not audio_sent:
            return Closing(None, 1003, message)
        return Closing({"error": message}, kind.lunavox_close, message)
