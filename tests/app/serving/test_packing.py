"""`segment_packing`: a model on a device gets every segment after its short first one packed up
to the engine's limit (fewer, fuller runs); on the CPU the budgets grow as before."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from app.main import create_app
from app.serving.service import SpeechService
from engines.registry import ModelHandle
from tests.app.protocols.test_streaming import segment_audio
from tests.conftest import test_settings
from tests.hearing import hear, word_error_rate

SENTENCES = [
    "The morning train left the station right on time.",
    "Outside, the wide fields were covered in a thin frost.",
    "A conductor walked slowly down the narrow aisle.",
    "He checked every single ticket with great care.",
    "Somewhere near the back, a small child was singing.",
    "The river beside the tracks ran fast and grey.",
]
TEXT = " ".join(SENTENCES * 2)  # ~600 characters: a short segment, a full one, the rest
LIMIT = 400  # Piper's max_segment_chars


def service(tmp_path: Path, packing: str, **overrides: object) -> SpeechService:
    app = create_app(test_settings(tmp_path, preload=[], segment_packing=packing, **overrides))
    svc: SpeechService = app.state.service
    return svc


def on(monkeypatch: pytest.MonkeyPatch, providers: tuple[str, ...]) -> None:
    """The model runs on `providers` (a CUDA session cannot open here; where the packing looks)."""
    monkeypatch.setattr(ModelHandle, "providers", property(lambda self: providers))


def assert_full(segments: list[str], first_chars: int) -> None:
    """The first segment short, each after it but the last packed: the next sentence would not
    have fitted."""
    assert len(segments[0]) <= first_chars < len(SENTENCES[0]) + 1
    for segment, after in pairwise(segments[1:]):
        following = next(s for s in SENTENCES if after.startswith(s))
        assert len(segment) <= LIMIT < len(segment) + 1 + len(following), (segment, following)


async def segments(svc: SpeechService) -> list[str]:
    plan = await svc.plan(model="piper", text=TEXT)
    return list(plan.segments)


async def test_auto_packs_full_on_a_device_and_grows_on_the_cpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    svc = service(tmp_path, "auto")
    try:
        on(monkeypatch, ("CPUExecutionProvider",))
        grown = await segments(svc)
        assert len(grown[1]) < LIMIT / 2  # budgets double: the second one is still short
        on(monkeypatch, ("CUDAExecutionProvider", "CPUExecutionProvider"))
        full = await segments(svc)
        assert_full(full, svc.settings.first_segment_chars)
        assert len(full) < len(grown)
        assert " ".join(full) == " ".join(grown) == " ".join(TEXT.split())
    finally:
        await svc.registry.close()


async def test_auto_reads_the_configured_providers_before_the_model_loads(
        tmp_path: Path) -> None:
    """A request planned before its model loads (no preload, after an idle unload, and always
    on a cluster's ingress, which loads no engine) is cut for where the model is configured to
    run; eSpeak NG, on no onnxruntime provider, grows whatever the providers say."""
    svc = service(tmp_path, "auto", providers="CUDAExecutionProvider,CPUExecutionProvider",
                  model_providers={"piper": "CUDAExecutionProvider,CPUExecutionProvider"})
    try:
        assert not svc.registry["piper"].engine.loaded
        assert_full(await segments(svc), svc.settings.first_segment_chars)
        plan = await svc.plan(model="espeak", text=TEXT, voice="en-us")
        assert len(plan.segments[1]) < 200  # grown from the first: 60, then 120
    finally:
        await svc.registry.close()


async def test_full_packing_is_heard_whole_with_clean_joins(tmp_path: Path) -> None:
    svc = service(tmp_path, "full")  # forced on the CPU: the same cut a device gets
    try:
        plan = await svc.plan(model="piper", text=TEXT)
        assert_full(plan.segments, svc.settings.first_segment_chars)
        chunks = await segment_audio(svc, plan)
        assert len(chunks) == len(plan.segments)
        inside = max(float(np.max(np.abs(np.diff(c)))) for c in chunks)
        joins = [abs(float(b[0]) - float(a[-1])) for a, b in pairwise(chunks)]
        assert max(joins) < inside / 20, (max(joins), inside)
        rate = svc.registry["piper"].engine.sample_rate
        heard = hear(np.concatenate(chunks), rate)
        assert word_error_rate(TEXT, heard.text) < 0.1, heard.text
    finally:
        await svc.registry.close()
