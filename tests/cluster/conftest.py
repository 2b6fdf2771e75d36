"""A real Ray cluster in this process: loopback only, 2 CPUs, a capped object store, no
dashboard, token authentication with a token kept in the environment. Ray reads part of that
environment when it is imported, so it is set here, before any test module imports Ray.

Only what a fixture started is shut down (never `ray stop`, which ends every Ray process on the
host, other people's included).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

if importlib.util.find_spec("ray") is None:  # the suite runs with the ray extra (make test)
    collect_ignore_glob = ["test_*.py"]
else:
    from app.cluster.launch import local_environment

    local_environment()

from app.settings import Settings
from tests.conftest import free_port, test_settings

OBJECT_STORE = 100 * 1024 * 1024


def cluster_settings(tmp: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "preload": [],
        "port": free_port(),
        "concurrency": 1,
        "queue_size": 1,
        "ray_cpus": 2,
        "ray_object_store_bytes": OBJECT_STORE,
        "ray_engine_cpus": 0.5,
        "ray_ingress_cpus": 0,
        "ray_engine_max_replicas": 1,  # a fixed count unless a test asks for autoscaling
        "request_timeout": 60,
    }
    values.update(overrides)
    return test_settings(tmp, **values)


def wait_healthy(url: str, replicas: int, timeout: float = 180) -> dict[str, Any]:
    """Until every engine replica reports and the ingress answers `ok` or `idle`."""
    deadline = time.monotonic() + timeout
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            body = httpx.get(url + "/health", timeout=10).json()
            reporting = len((body.get("cluster") or {}).get("replicas", []))
            if body["status"] in ("ok", "idle") and reporting == replicas:
                return body
        except (httpx.TransportError, ValueError, KeyError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"the cluster did not become healthy: {body}")


def cluster_state(url: str) -> list[dict[str, Any]]:
    replicas: list[dict[str, Any]] = httpx.get(url + "/stats", timeout=10).json()["cluster"][
        "replicas"]
    return replicas


def holders(url: str, model: str) -> list[str]:
    return [r["id"] for r in cluster_state(url) if model in r["holds"]]


@pytest.fixture(scope="session")
def ray_available() -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed (pip install '.[ray]'; make test does)")


def until(check: Any, timeout: float = 30, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(every)




def in_replicas(deployment: str, check: Any) -> list[Any]:
    """`check()` run inside every replica of `deployment` (its actor, through Ray)."""
    import ray

    from app.cluster.app import APP_NAME

    results = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith(f"SERVE_REPLICA::{APP_NAME}#{deployment}#"):
            handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
            results.append(ray.get(handle.__ray_call__.remote(lambda _: check())))
    return results
