"""Two Ray nodes on this machine (`ray.cluster_utils.Cluster`, one CPU each, loopback): the
second has a resource of its own, Piper's engine deployment asks for it, and the first node's
ingress serves Piper from there."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.cluster import launch
from app.cluster.app import ENGINES, INGRESS, placed_name
from app.cluster.reports import LOCAL_REPORT_MS
from tests.cluster.conftest import (
    OBJECT_STORE,
    cluster_settings,
    cluster_state,
    in_replicas,
    until,
    wait_healthy,
)
from tests.conftest import decode

SECOND = "voxmux_second_node"


@dataclass
class TwoNodes:
    url: str
    head: str
    second: str


@pytest.fixture(scope="module")
def two_nodes(ray_available: None, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[TwoNodes]:
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={
        **node, "resources": {"voxmux_head": 1},
        "_system_config": {"metrics_report_interval_ms": LOCAL_REPORT_MS}})
    try:
        second = cluster.add_node(**node, resources={SECOND: 1})
        ray.init(address=cluster.address, log_to_driver=False)
        settings = cluster_settings(Path(tmp_path_factory.mktemp("nodes")),
                                    ray_engine_replicas=1, ray_engine_cpus=0.5,
                                    ray_model_resources={"piper": {SECOND: 1}})
        # The ingress asks for a resource only the head has: it is the first node's.
        url = launch.deploy(settings, ingress_options={"ray_actor_options": {
            "num_cpus": 0, "resources": {"voxmux_head": 0.01}}})
        wait_healthy(url, replicas=2)
        yield TwoNodes(url, cluster.head_node.node_id, second.node_id)
    finally:
        from ray import serve

        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
        cluster.shutdown()


def node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def test_piper_is_placed_on_the_second_node_and_served_through_the_first(two_nodes: TwoNodes
                                                                         ) -> None:
    import ray
    from ray import serve

    from app.cluster.app import APP_NAME

    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    deployments = set(serve.status().applications[APP_NAME].deployments)
    assert deployments == {INGRESS, ENGINES, placed_name("piper")}
    with httpx.Client(base_url=two_nodes.url, timeout=120) as http:
        for model in ("piper", "espeak"):
            response = http.post("/v1/audio/speech", json={
                "model": model, "input": f"Spoken by {model} on its node.",
                "response_format": "wav"})
            assert response.status_code == 200, response.text
            audio = decode(response.content, "wav")
            assert audio.duration > 0.5 and audio.rms > 0.01

    def placed() -> dict[str, str]:
        return {model: r["node"] for r in cluster_state(two_nodes.url) for model in r["holds"]}

    assert until(lambda: {"piper", "espeak"} <= set(placed()))
    assert placed()["piper"] == two_nodes.second
    assert in_replicas(INGRESS, node_id) == [two_nodes.head]
    assert in_replicas(placed_name("piper"), node_id) == [two_nodes.second]
