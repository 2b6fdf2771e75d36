"""The compose file and the KubeRay RayService in docker/ray/ name things that exist: settings
VoxMux reads, the application builder, its deployments, a Redis configured as the guard behind
the cache budgets."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cluster.app import build_app, engine_scaling
from app.settings import Settings

RAY = Path(__file__).resolve().parents[2] / "docker" / "ray"


def voxmux_env(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings as a container with `env` would read them; every VOXMUX_ name must be known."""
    for name in [n for n in os.environ if n.startswith("VOXMUX_")]:
        monkeypatch.delenv(name)
    fields = {f"VOXMUX_{name.upper()}" for name in Settings.model_fields}
    for name, value in env.items():
        if name.startswith("VOXMUX_"):
            assert name in fields, f"{name} is not a VoxMux setting"
            monkeypatch.setenv(name, str(value))
    return Settings()


def test_compose_runs_voxmux_on_the_cluster_with_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load((RAY / "compose.yaml").read_text())
    services = compose["services"]
    redis = " ".join(services["redis"]["command"])
    assert "--maxmemory 320mb" in redis and "--maxmemory-policy allkeys-lru" in redis
    head, worker = services["ray-head"], services["ray-worker"]
    assert "voxmux serve --ray-address auto" in head["command"]
    assert "ray start --address=ray-head:6379" in worker["command"]
    env = {k: v for k, v in head["environment"].items() if "${" not in str(v)}
    settings = voxmux_env(env, monkeypatch)
    assert settings.cache_url == "redis://redis:6379/0"
    assert head["ports"] == [f"{settings.port}:{settings.port}"]
    assert settings.cache_max_bytes < 320 * 2**20  # the guard sits above VoxMux's budget
    assert head["environment"]["RAY_AUTH_MODE"] == "token"


def test_rayservice_names_the_builder_and_autoscales_what_its_workers_hold(
        monkeypatch: pytest.MonkeyPatch) -> None:
    service = yaml.safe_load((RAY / "rayservice.yaml").read_text())
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    (application,) = config["applications"]
    module, _, name = application["import_path"].partition(":")
    assert getattr(importlib.import_module(module), name) is build_app
    assert "deployments" not in application  # sizing and autoscaling come from VOXMUX_*
    settings = voxmux_env(application["runtime_env"]["env_vars"], monkeypatch)
    assert settings.cache_url
    scaling = engine_scaling(settings)["autoscaling_config"]
    assert (scaling["min_replicas"], scaling["max_replicas"]) == (2, 8)
    assert scaling["target_ongoing_requests"] == settings.concurrency == 1
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    (workers,) = cluster["workerGroupSpecs"]
    cpus = float(workers["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    # At the ceiling, even with each ingress replica on a pod of its own, the engines fit.
    with_ingress = min(settings.ray_ingress_replicas, workers["maxReplicas"])
    fits = (with_ingress * ((cpus - settings.ray_ingress_cpus) // settings.ray_engine_cpus)
            + (workers["maxReplicas"] - with_ingress) * (cpus // settings.ray_engine_cpus))
    assert fits >= scaling["max_replicas"]
    assert cluster["rayVersion"] == importlib.metadata.version("ray")
    assert build_app(dict(application["args"])) is not None  # builds without a cluster
