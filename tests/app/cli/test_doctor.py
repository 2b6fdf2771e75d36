"""`voxmux doctor`: what it reports and when it says the installation is not usable."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import doctor
from app.settings import Settings
from engines.kokoro import assemble_model
from engines.onnx import runtime_version
from tests.conftest import CACHE_DIR, test_settings

ROOT = Path(__file__).resolve().parents[3]
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


def settings(tmp_path: Path, **overrides: object) -> Settings:
    return test_settings(tmp_path, **overrides)


def test_report_names_runtime_models_voices_and_dirs(tmp_path: Path) -> None:
    assemble_model(CACHE_DIR)  # what the session server does first in a fresh clone
    report = doctor.collect(settings(tmp_path))
    assert report["ok"] and report["problems"] == [] and report["warnings"] == []
    assert report["python"]["version"] == platform.python_version()
    ort = report["onnxruntime"]
    assert ort["version"] == runtime_version()
    assert CPU in ort["available_providers"] and ort["session_providers"] == [CPU]
    nvml = report["nvml"]
    if not nvml["available"]:  # this machine: no NVIDIA driver
        assert nvml["detail"] and nvml["devices"] == []
    models = report["models"]
    assert set(models) == {"kokoro", "piper", "hibari", "espeak"}
    assert {"jf_alpha", "jm_kumo"} <= set(models["kokoro"]["sample_voices"])
    assert models["kokoro"]["voices"] >= 5
    assert models["kokoro"]["weights"] == f"assembled: {CACHE_DIR / 'kokoro-v1.0.int8.onnx'}"
    assert models["piper"]["sample_voices"] == ["en_US-joe-medium"]
    assert models["espeak"]["voices"] > 100
    assert all(m["installed"] and m["error"] is None for m in models.values())
    dirs = report["dirs"]
    assert dirs["credentials_dir"] == {"path": str(tmp_path / "credentials"), "exists": False,
                                       "writable": True}
    assert dirs["cache_dir"]["writable"]


def test_report_shows_the_profile_and_its_key_settings(tmp_path: Path) -> None:
    report = doctor.collect(settings(tmp_path, profile="gpu", port=8101, api_keys="s3cret-key"))
    profile = report["profile"]
    assert profile["name"] == "gpu" and profile["file"].endswith("config/profiles/gpu.env")
    shown = profile["settings"]
    assert shown["port"] == 8101 and shown["providers"] == [CPU]
    assert {"concurrency", "queue_size", "request_timeout", "idle_ttl", "cache_max_bytes",
            "cache_max_items", "intra_op_threads"} <= set(shown)
    assert shown["api_keys"] == "1 set"
    assert "s3cret-key" not in json.dumps(report) and "s3cret-key" not in doctor.render(report)


def test_gpu_requested_without_cuda_is_a_warning_not_a_problem(tmp_path: Path) -> None:
    report = doctor.collect(settings(tmp_path, providers=[CUDA, CPU]))
    if CUDA in report["onnxruntime"]["session_providers"]:
        pytest.skip("this machine runs CUDA")
    assert report["ok"] and doctor.exit_code(report) == 0
    assert doctor.exit_code(report, strict=True) == 1
    assert any(w.startswith(f"{CUDA} requested but") for w in report["warnings"])
    assert report["onnxruntime"]["requested_providers"] == [CUDA, CPU]


def test_unwritable_dirs_and_missing_weights_are_problems(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a dir")
    report = doctor.collect(settings(tmp_path, cache_dir=blocker / "cache",
                                     credentials_dir=blocker / "credentials", api_keys="auto",
                                     log_dir=blocker / "logs"))
    assert not report["ok"] and doctor.exit_code(report) == 1
    problems = "\n".join(report["problems"])
    assert "kokoro: weights are not assembled" in problems
    assert f"credentials_dir {blocker / 'credentials'} is not writable" in problems
    assert f"log_dir {blocker / 'logs'} is not writable" in problems
    assert report["models"]["kokoro"]["weights"] == "missing"


def test_broken_catalogue_entry_is_a_problem(tmp_path: Path) -> None:
    catalogue = tmp_path / "models.toml"
    catalogue.write_text((ROOT / "config" / "models.toml").read_text() + """
[models.robot]
engine = "nope"
default_voice = "x"
""")
    report = doctor.collect(settings(tmp_path, catalogue=catalogue, preload=["ghost"]))
    assert not report["ok"]
    assert report["models"]["robot"]["error"].startswith("UnknownEngine: unknown engine 'nope'")
    assert report["models"]["piper"]["installed"]  # the others are still reported
    assert any("preload names 'ghost'" in w for w in report["warnings"])


def test_text_report_reads_well(tmp_path: Path) -> None:
    text = doctor.render(doctor.collect(settings(tmp_path, providers=[CUDA, CPU])))
    for needle in ("VoxMux doctor: profile cpu", "onnxruntime", runtime_version(), "NVML",
                   "kokoro", "voices: ", "jf_alpha", "en_US-joe-medium", "credentials_dir",
                   "Result: usable"):
        assert needle in text


def test_cli_doctor_json(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXMUX_")}
    env.update(VOXMUX_CACHE_DIR=str(CACHE_DIR), VOXMUX_CREDENTIALS_DIR=str(tmp_path / "cred"),
               VOXMUX_MODELS_DIR=str(tmp_path / "models"))
    done = subprocess.run([sys.executable, "-m", "app.cli", "doctor", "--profile", "gpu", "--json"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert report["profile"]["name"] == "gpu" and report["profile"]["settings"]["port"] == 8101
    assert report["onnxruntime"]["requested_providers"] == [CUDA, CPU]
    assert done.returncode == 0, done.stderr  # CPU fallback is usable
    strict = subprocess.run(
        [sys.executable, "-m", "app.cli", "doctor", "--profile", "gpu", "--strict"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    fell_back = CUDA not in report["onnxruntime"]["session_providers"]
    assert strict.returncode == (1 if fell_back else 0)
    assert "Result: usable" in strict.stdout
