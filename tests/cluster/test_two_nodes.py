"""Two simulated nodes (`ray.cluster_utils.Cluster`, one CPU each, loopback): an engine replica
on each, and each model placed on its own node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.cluster import launch
from app.cluster.reports import LOCAL_REPORT_MS
from tests.cluster.conftest import (
    OBJECT_STORE,
    cluster_settings,
    cluster_state,
    until,
    wait_healthy,
)
from tests.conftest import decode


@pytest.fixture(scope="module")
def two_nodes(ray_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={
        **node, "_system_config": {"metrics_report_interval_ms": LOCAL_REPORT_MS}})
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, log_to_driver=False)
        settings = cluster_settings(Path(tmp_path_factory.mktemp("nodes")),
                                    ray_engine_replicas=2, ray_engine_cpus=1,
                                    ray_models_per_replica=1)
        url = launch.deploy(settings)
        wait_healthy(url, replicas=2)
        yield url
    finally:
        from ray import serve

        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        cluster.shutdown()


def test_each_model_is_served_from_its_own_node(two_nodes: str) -> None:
    import ray

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    with httpx.Client(base_url=two_nodes, timeout=120) as http:
        for model in ("piper", "espeak"):
            response = http.post("/v1/audio/speech", json={
                "model": model, "input": f"Spoken on the {model} node.", "response_format": "wav"})
            assert response.status_code == 200
            audio = decode(response.content, "wav")
            assert audio.duration > 0.5 and audio.rms > 0.01

    def placed() -> dict[str, str]:
        return {model: r["node"] for r in cluster_state(two_nodes) for model in r["holds"]}

    assert until(lambda: len(placed()) == 2)
    nodes = placed()
    assert set(nodes) == {"piper", "espeak"} and nodes["piper"] != nodes["espeak"]
    assert set(nodes.values()) == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
