"""The blend editor: two to four voices of a model that blends voices
(`Capabilities.voice_blending`), each with a weight, written as the voice string the API takes:
`jf_alpha(2)+jm_kumo(1)`.

Weights are whole numbers on the sliders; the string keeps them in lowest terms (6 and 3 are
written 2 and 1: the same blend, the same cache entry) and names each voice once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.serving.service import SpeechService
from engines.base import Voice, VoxMuxError

ROWS = 4
WEIGHT_MAX = 10
PROBE = "Hello."
"""A text any blend is checked on: the voice is what is being checked."""


@dataclass(frozen=True)
class BlendRow:
    voice: str
    """A voice id, or empty: the row is left out."""
    weight: int


@dataclass(frozen=True)
class BlendEditor:
    model: str
    models: list[str]
    """Every model that blends voices."""
    voices: list[Voice]
    rows: list[BlendRow]


@dataclass(frozen=True)
class Mix:
    spec: str
    """The voice string; empty when no row has a voice and a weight."""
    shares: list[tuple[str, float]]
    """Each voice and its share of the blend, in percent."""
    error: str | None = None


def blending_models(service: SpeechService) -> list[str]:
    return [h.id for h in service.models() if h.engine.capabilities.voice_blending]


def editor(service: SpeechService, model: str = "") -> BlendEditor | None:
    """The editor for `model` (the first blending model if it does not blend), starting from its
    first two voices in equal parts; None when no model blends voices."""
    models = blending_models(service)
    if not models:
        return None
    chosen = model if model in models else models[0]
    voices = service.registry[chosen].engine.voices()
    start = [v.id for v in voices[:2]]
    rows = [BlendRow(voice, 1) for voice in start]
    rows += [BlendRow("", 1)] * (ROWS - len(rows))
    return BlendEditor(chosen, models, voices, rows)


def blend_spec(rows: list[BlendRow]) -> tuple[str, list[tuple[str, float]]]:
    """The voice string of `rows` and each voice's share in percent."""
    weights: dict[str, int] = {}
    for row in rows:
        if row.voice and row.weight > 0:
            weights[row.voice] = weights.get(row.voice, 0) + row.weight
    if not weights:
        return "", []
    total = sum(weights.values())
    shares = [(voice, 100 * weight / total) for voice, weight in weights.items()]
    if len(weights) == 1:
        return next(iter(weights)), shares
    common = math.gcd(*weights.values())
    return "+".join(f"{voice}({weight // common})" for voice, weight in weights.items()), shares


def parse_rows(voices: list[str], weights: list[str]) -> list[BlendRow]:
    """The editor's form fields (`voice` and `weight`, once per row) -> rows."""
    rows = []
    for voice, raw in zip(voices[:ROWS], weights[:ROWS], strict=False):
        try:
            weight = min(max(int(float(raw)), 0), WEIGHT_MAX)
        except ValueError:
            weight = 0
        rows.append(BlendRow(voice.strip(), weight))
    return rows


async def mix(service: SpeechService, model: str, rows: list[BlendRow]) -> Mix:
    """The blend of `rows`, checked by the model as any request's voice is."""
    spec, shares = blend_spec(rows)
    if not spec:
        return Mix("", [], "Give at least one voice a weight above zero.")
    try:
        plan = await service.plan(model=model, text=PROBE, voice=spec)
    except VoxMuxError as exc:
        return Mix(spec, shares, exc.message)
    if plan.voice != spec:  # VOXMUX_UNKNOWN_VOICE=default would speak another voice
        return Mix(spec, shares, "; ".join(plan.warnings) or f"{model} speaks {plan.voice}")
    return Mix(spec, shares)
