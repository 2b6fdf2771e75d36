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
from tests.conftest import test_settings

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
    # Jobs live in Redis too: it never evicts, and the two budgets fit under its guard.
    assert "--maxmemory-policy noeviction" in redis and "--appendonly yes" in redis
    guard = int(redis.split("--maxmemory ")[1].split("mb")[0]) * 2**20
    head, worker = services["ray-head"], services["ray-worker"]
    assert "voxmux serve --ray-address auto" in head["command"]
    assert "ray start --address=ray-head:6379" in worker["command"]
    env = {k: v for k, v in head["environment"].items() if "${" not in str(v)}
    settings = voxmux_env(env, monkeypatch)
    assert settings.cache_url == "redis://redis:6379/0"
    assert head["ports"] == [f"{settings.port}:{settings.port}"]
    assert settings.cache_max_bytes + settings.jobs_max_bytes < guard
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


def test_engine_deployments_ask_serve_for_a_short_routing_backoff_and_gpus(tmp_path: Path) -> None:
    """A request waiting for an engine replica is tried again within
    `VOXMUX_RAY_ROUTER_MAX_BACKOFF` (Serve's own 0.5 s leaves a replica idle between requests;
    bench/results/ray.json measures the effect)."""
    from app.cluster.app import build

    settings = test_settings(tmp_path, ray_router_max_backoff=0.04,
                             ray_model_resources={"piper": {"GPU": 1}})
    ingress = build(settings)._bound_deployment
    engines, placed = ingress.init_args[1], ingress.init_args[2]
    for app in (engines, placed["piper"]):
        config = app._bound_deployment._deployment_config.request_router_config
        assert (config.initial_backoff_s, config.max_backoff_s) == (0.025, 0.04)
    # A model placed on a GPU asks Ray for it as `num_gpus` (Ray refuses `GPU` in `resources`).
    options = placed["piper"]._bound_deployment.ray_actor_options
    assert options["num_gpus"] == 1 and "GPU" not in options["resources"]


def test_jobs_refuse_a_store_of_their_own_behind_several_ingress_replicas(
        tmp_path: Path) -> None:
    """Without Redis, each ingress replica kept its own SQLite file (or, on a shared volume,
    both requeued the same interrupted jobs): jobs answer 503 naming the fix instead."""
    import asyncio
    from types import SimpleNamespace

    from app.jobs.model import StoreUnavailable
    from app.jobs.runner import JobRunner

    async def started(**settings: object) -> str | None:
        runner = JobRunner(SimpleNamespace(fleet=object()),  # type: ignore[arg-type]
                           test_settings(tmp_path, **settings))
        await runner.start()
        try:
            runner.available()
        except StoreUnavailable as exc:
            return str(exc)
        finally:
            await runner.stop()
        return None

    def refusal(**settings: object) -> str | None:
        return asyncio.run(started(**settings))

    refused = refusal(ray_ingress_replicas=2)
    assert refused is not None and "VOXMUX_CACHE_URL" in refused
    assert "VOXMUX_RAY_INGRESS_REPLICAS" in refused
    assert not (tmp_path / "data" / "jobs.sqlite3").exists()
    assert refusal(ray_ingress_replicas=1) is None  # one replica: its own store is the store


def test_the_deployments_run_two_ingress_replicas() -> None:
    """One ingress replica was every HTTP request's single point of failure."""
    compose = yaml.safe_load((RAY / "compose.yaml").read_text())
    service = yaml.safe_load((RAY / "rayservice.yaml").read_text())
    (application,) = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    for env in (compose["services"]["ray-head"]["environment"],
                application["runtime_env"]["env_vars"]):
        assert int(env["VOXMUX_RAY_INGRESS_REPLICAS"]) >= 2
        assert env["VOXMUX_CACHE_URL"].startswith("redis://")  # jobs and cancels shared


def test_a_fraction_of_a_gpu_from_the_environment_packs_replicas_on_one_card(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`VOXMUX_RAY_MODEL_RESOURCES__KOKORO__GPU=0.25` arrives as `gpu` (environment keys are
    lower case) and must still be Ray's `num_gpus`, not a custom resource no node has; Ray takes
    a fraction above one only in whole GPUs, refused at build time with the reason."""
    from app.cluster.app import build

    monkeypatch.setenv("VOXMUX_RAY_MODEL_RESOURCES__KOKORO__GPU", "0.25")
    settings = test_settings(tmp_path)
    assert settings.ray_model_resources == {"kokoro": {"gpu": 0.25}}
    placed = build(settings)._bound_deployment.init_args[2]
    options = placed["kokoro"]._bound_deployment.ray_actor_options
    assert options["num_gpus"] == 0.25 and options["resources"] == {}
    assert options["num_cpus"] == settings.ray_engine_cpus
    monkeypatch.setenv("VOXMUX_RAY_MODEL_RESOURCES__KOKORO__GPU", "1.5")
    with pytest.raises(ValueError, match="whole GPUs"):
        build(test_settings(tmp_path))
