"""LunaVox's request and stats vocabulary, translated to and from the speech service's.

LunaVox's `voice` is a mode, VoxMux's a voice id; one field carries both here. The mode words
`base`, `custom`, `clone` and `design` are modes; anything else is a voice id (mode `custom`).
`base` is the model's default voice, `custom` speaks the voice named by `speaker`; `clone` and
`design` need engines VoxMux does not ship, so they are refused with what is missing. The
sampling fields of LunaVox's autoregressive model mean nothing to these engines: they are
accepted and named as ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.protocols.schemas import SynthOptions
from app.serving.service import SpeechJob, SpeechService
from engines.base import InvalidParameter

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


def plan(service: SpeechService, options: SynthOptions, text: str, request_id: str
         ) -> tuple[SpeechJob, VoiceChoice]:
    """Plan a job from LunaVox-style options; ignored fields also become a job warning."""
    choice = choose_voice(options)
    job = service.plan(
        model=options.model or service.settings.default_model,
        text=text,
        voice=choice.voice,
        speed=options.speed,
        language=options.language,
        instructions=options.instructions,
        request_id=request_id,
    )
    if choice.ignored:
        job.warnings.append(f"ignored: {', '.join(choice.ignored)} (no sampling engine here)")
    return job, choice


def stats(envelope: Mapping[str, Any], ignored: tuple[str, ...]) -> dict[str, Any]:
    """LunaVox's stats from VoxMux's envelope; its numbers are never null (0 where unknown)."""
    mem: Mapping[str, Any] = envelope.get("mem") or {}
    return {
        "t_total_ms": envelope.get("t_total_ms") or 0.0,
        "audio_duration_ms": envelope.get("audio_duration_ms") or 0.0,
        "rtf": envelope.get("rtf") or 0.0,
        "mem": {f"{name}_bytes": int(mem.get(name) or 0) for name in _MEMORY}
        | {"vram_measured": bool(mem.get("vram_measured"))},
        "ttfb_ms": envelope.get("ttfb_ms"),
        "segments": envelope.get("segments"),
        "ignored": list(ignored),
    }


def synth_stats(job: SpeechJob, n_samples: int, choice: VoiceChoice) -> dict[str, Any]:
    """The `X-Lunavox-Stats` header of `POST /v1/synth`."""
    envelope = job.stats.envelope(job.sample_rate, len(job.segments))
    return {
        "sample_rate": job.sample_rate,
        "n_samples": n_samples,
        "mode": choice.mode,
        "stats": stats(envelope, choice.ignored),
    }
