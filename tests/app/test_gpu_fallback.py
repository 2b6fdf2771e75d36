"""A GPU profile on a machine without CUDA: speech still works on CPU, and `/health` and the log
say so with the reason, from the very start, never silently."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.main import create_app
from app.serving.catalogue import Catalogue
from app.serving.scheduler import Lane
from app.serving.wiring import build_registry, runtime_options
from engines.registry import EngineRegistry
from tests.conftest import decode, start_server, test_settings

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
GPU_PROVIDERS = [CUDA, CPU]


def test_fallback_is_known_before_any_model_loads(tmp_path: Path) -> None:
    app = create_app(test_settings(tmp_path, providers=GPU_PROVIDERS, preload=[]))
    assert app.state.service.registry.status()["piper"].status == "unloaded"
    (note,) = app.state.runtime.fallbacks
    assert note.startswith(f"{CUDA} requested but ")


def test_cuda_requested_serves_on_cpu_and_health_is_degraded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="engines.onnx")
    live = start_server(test_settings(tmp_path, providers=GPU_PROVIDERS, preload=["piper"]))
    try:
        with live.client() as http:
            response = http.post("/v1/audio/speech", json={
                "model": "piper", "voice": "alloy", "input": "Still speaking, on the CPU.",
                "response_format": "wav"})
            assert response.status_code == 200, response.text
            audio = decode(response.content, "wav")
            assert audio.sample_rate == 22_050
            assert 1.0 < audio.duration < 6.0 and audio.rms > 0.01

            assert http.post("/v1/models/kokoro/load").json()["status"] == "ready"
            health = http.get("/health").json()
    finally:
        live.stop()
    if CUDA in live.app.state.runtime.in_use:
        pytest.skip("this machine runs CUDA")
    assert health["status"] == "degraded"
    assert health["models"]["piper"]["status"] == "ready"
    for model in ("piper", "kokoro"):  # each model says it runs on the CPU it fell back to
        assert health["models"][model]["providers"] == [CPU], model
        # one instance each, its VRAM none, and why
        assert health["models"][model]["instances"] == 1, model
        assert health["models"][model]["vram_per_instance_mib"] is None
        assert health["models"][model]["vram_note"] == "runs on the CPU"
    assert health["models"]["espeak"]["instances"] is None  # no sessions (and not loaded)
    (warning,) = health["warnings"]
    assert warning.startswith(f"{CUDA} requested but ")
    assert ("not available in this onnxruntime" in warning
            or "the session fell back to CPUExecutionProvider" in warning)
    logged = [r for r in caplog.records if CUDA in r.getMessage()]
    assert [r.getMessage() for r in logged] == [warning]  # once, though three sessions opened
    assert logged[0].levelno == logging.WARNING


def test_a_model_of_its_own_providers_and_instances_gets_them(tmp_path: Path) -> None:
    """The GPU profile's Piper on the CPU beside Kokoro on CUDA: its sessions never ask for
    CUDA (no fallback noted when it loads, where the same load on the profile's providers notes
    one), and its lane runs one call per instance."""
    def registry(**overrides: object) -> tuple[EngineRegistry[Lane], list[str]]:
        settings = test_settings(tmp_path, providers=GPU_PROVIDERS, preload=[], **overrides)
        runtime = runtime_options(settings)
        built = build_registry(settings, Catalogue.load(settings.catalogue_path), runtime)
        piper = built["piper"].engine
        piper.load()
        try:
            assert built["piper"].engine.providers() == (CPU,)
        finally:
            piper.unload()
        return built, runtime.fallbacks

    own, notes = registry(model_providers={"piper": CPU}, model_instances={"piper": 2})
    assert notes == []
    assert own["piper"].lane.concurrency == 2
    assert own["piper"].engine._runtime.providers == (CPU,)
    assert own["kokoro"].engine._runtime.providers == tuple(GPU_PROVIDERS)
    assert own["kokoro"].lane.concurrency == 1
    _, shared = registry()
    if not shared:
        pytest.skip("this machine runs CUDA")
    assert shared[0].startswith(f"{CUDA} requested but ")
