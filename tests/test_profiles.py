"""Deployment profiles: each env file loads into Settings, the environment overrides it, and
`voxmux serve`/`voxmux doctor` resolve `--profile` / `VOXMUX_PROFILE` the same way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from dotenv import dotenv_values

from app.cli.main import build_parser, resolve_settings
from app.settings import Settings, load_settings, profiles_dir

PROFILES = {"cpu": 8100, "gpu": 8101, "legacy-gpu": 8102}
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own VOXMUX_* variables must not leak into what a profile file says."""
    for name in list(os.environ):
        if name.upper().startswith("VOXMUX_"):
            monkeypatch.delenv(name)


def entries(profile: str) -> dict[str, str]:
    values = dotenv_values(profiles_dir() / f"{profile}.env")
    return {key: value for key, value in values.items() if value is not None}


def test_every_profile_file_exists_and_only_those() -> None:
    assert {p.stem for p in profiles_dir().glob("*.env")} == set(PROFILES)


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_names_only_real_settings(profile: str) -> None:
    # Settings ignores unknown variables, so a typo in a profile would silently do nothing.
    fields = set(Settings.model_fields)
    for key in entries(profile):
        assert key.startswith("VOXMUX_"), key
        field = key.removeprefix("VOXMUX_").lower().split("__")[0]
        assert field in fields, f"{profile}.env sets {key}, which is no setting"


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_loads_with_the_values_it_names(profile: str) -> None:
    settings = load_settings(profile)
    values = entries(profile)
    nested: dict[str, dict[str, str]] = {}
    for key, raw in values.items():
        name = key.removeprefix("VOXMUX_").lower()
        if "__" in name:
            field, sub = name.split("__", 1)
            nested.setdefault(field, {})[sub] = raw
            continue
        expected = getattr(Settings(**{name: raw}), name)  # the file's text, validated alone
        assert getattr(settings, name) == expected, f"{profile}: {name}"
    for field, items in nested.items():
        expected = getattr(Settings(**{field: items}), field)  # validated alone, as above
        assert getattr(settings, field) == expected, f"{profile}: {field}"
    assert settings.profile == profile
    assert settings.port == PROFILES[profile]
    for budget in ("cache_max_items", "cache_max_bytes", "cache_max_item_bytes", "idle_ttl",
                   "concurrency", "queue_size", "request_timeout", "intra_op_threads",
                   "providers", "preload"):
        assert f"VOXMUX_{budget.upper()}" in values, f"{profile} leaves {budget} to the default"


def test_profiles_differ_where_the_hardware_does() -> None:
    cpu, gpu, legacy = (load_settings(p) for p in PROFILES)
    assert cpu.providers == [CPU]
    assert gpu.providers == [CUDA, CPU] and legacy.providers == [CUDA, CPU]
    assert gpu.concurrency > cpu.concurrency and legacy.concurrency == 1
    assert legacy.request_timeout > gpu.request_timeout
    assert legacy.cuda_options["cudnn_conv_algo_search"] == "HEURISTIC"
    assert int(legacy.cuda_options["gpu_mem_limit"]) == 2 * 1024**3
    assert gpu.idle_ttl == -1 and cpu.idle_ttl > 0
    assert gpu.cache_max_bytes > cpu.cache_max_bytes
    # int8 on CPU (its integer kernels are CPU ones); float graphs where CUDA runs them.
    assert (cpu.kokoro_precision, gpu.kokoro_precision, legacy.kokoro_precision) == (
        "int8", "fp16", "fp32")


def test_environment_overrides_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXMUX_PORT", "9123")
    monkeypatch.setenv("VOXMUX_PROVIDERS", CPU)
    monkeypatch.setenv("VOXMUX_CUDA_OPTIONS__DEVICE_ID", "1")
    settings = load_settings("gpu")
    assert settings.port == 9123
    assert settings.providers == [CPU]
    assert settings.cuda_options == {"device_id": "1"}
    assert settings.concurrency == 4  # untouched values still come from the profile


def test_explicit_arguments_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXMUX_PORT", "9123")
    assert load_settings("gpu", port=9200).port == 9200


def test_unknown_profile_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown profile 'nope' \(known: cpu, gpu, legacy-gpu\)"):
        load_settings("nope")


def serve(*argv: str) -> Settings:
    return resolve_settings(build_parser().parse_args(["serve", *argv]))


def test_cli_profile_flag() -> None:
    settings = serve("--profile", "legacy-gpu")
    assert (settings.profile, settings.port, settings.concurrency) == ("legacy-gpu", 8102, 1)


def test_cli_profile_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXMUX_PROFILE", "gpu")
    settings = serve()
    assert (settings.profile, settings.port) == ("gpu", 8101)


def test_cli_defaults_to_the_cpu_profile() -> None:
    settings = serve()
    assert (settings.profile, settings.port, settings.providers) == ("cpu", 8100, [CPU])


def test_cli_flag_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXMUX_PROFILE", "gpu")
    settings = serve("--profile", "cpu", "--port", "9300", "--host", "0.0.0.0")
    assert (settings.profile, settings.port, settings.host) == ("cpu", 9300, "0.0.0.0")
    assert settings.providers == [CPU]


def test_cli_env_var_beats_profile_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXMUX_CONCURRENCY", "7")
    assert serve("--profile", "gpu").concurrency == 7


def test_cli_unknown_profile_exits_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--profile", "nope"])
    assert exit_info.value.code == 2
    assert "unknown profile 'nope'" in capsys.readouterr().err


def test_make_serve_uses_a_profile() -> None:
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert "voxmux serve --profile $(PROFILE)" in makefile


@pytest.mark.parametrize("profile", ["gpu", "legacy-gpu"])
def test_gpu_profiles_put_each_model_on_its_faster_provider(profile: str) -> None:
    """Piper on the CPU beside Kokoro on CUDA (bench/results/gpu.md: Piper's graph ran slower
    on CUDA than on two CPU cores); the gpu profile runs two Kokoro instances on the card."""
    settings = load_settings(profile)
    assert settings.providers_for("kokoro") == [CUDA, CPU]
    assert settings.providers_for("piper") == [CPU]
    assert settings.instances_for("piper") == 1
    assert settings.instances_for("kokoro") == (2 if profile == "gpu" else 1)
    assert load_settings("cpu").instances_for("kokoro") == 1
