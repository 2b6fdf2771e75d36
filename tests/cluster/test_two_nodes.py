"""Two Ray nodes on this machine (`ray.cluster_utils.Cluster`, one CPU each, loopback): the
second has a resource of its own, Piper's engine deployment asks for it, and the first node's
ingress serves Piper from there. Then a third node with that resource joins and the second is
removed while it streams and renders a job: the stream ends with an error event, Serve places
Piper's replica on the third node, the next request is served there and the job finishes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    cluster: Any
    second_node: Any


@pytest.fixture(scope="module")
def two_nodes(ray_available: None, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[TwoNodes]:
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={
        **node, "resources": {"voxmux_head": 1},
        # A node that goes is known dead within about a second (Ray's default: 30 s).
        "_system_config": {"metrics_report_interval_ms": LOCAL_REPORT_MS,
                           "health_check_period_ms": 500,
                           "health_check_failure_threshold": 2}})
    try:
        second = cluster.add_node(**node, resources={SECOND: 1})
        ray.init(address=cluster.address, log_to_driver=False)
        settings = cluster_settings(Path(tmp_path_factory.mktemp("nodes")),
                                    ray_engine_replicas=1, ray_engine_cpus=0.5, queue_size=4,
                                    ray_model_resources={"piper": {SECOND: 1}})
        # Every node here is this machine: a proxy per node would share the port, and a
        # connection taken by the second node's proxy would go with it. One proxy, the head's,
        # as behind a load balancer that sends to live nodes only.
        from ray import serve

        serve.start(proxy_location="HeadOnly",
                    http_options={"host": settings.host, "port": settings.port})
        # The ingress asks for a resource only the head has: it is the first node's.
        url = launch.deploy(settings, ingress_options={"ray_actor_options": {
            "num_cpus": 0, "resources": {"voxmux_head": 0.01}}})
        wait_healthy(url, replicas=2)
        yield TwoNodes(url, cluster.head_node.node_id, second.node_id, cluster, second)
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


def test_a_node_removed_mid_stream_and_mid_job_is_replaced(two_nodes: TwoNodes) -> None:
    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE, "include_dashboard": False}
    third = two_nodes.cluster.add_node(**node, resources={SECOND: 1})
    # Four job segments of at most 400 characters (Piper's): one done when the node goes.
    sentences = 20
    text = " ".join(f"Sentence number {n} of the long text, spoken on another node."
                    for n in range(sentences))
    events: list[dict[str, Any]] = []
    with httpx.Client(base_url=two_nodes.url, timeout=300) as http:
        job = http.post("/v1/audio/jobs", json={"model": "piper", "input": text,
                                                "response_format": "wav"})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        started = threading.Event()

        def stream() -> None:
            with httpx.Client(base_url=two_nodes.url, timeout=300) as client, client.stream(
                    "POST", "/v1/audio/speech", json={
                        "model": "piper", "input": text, "response_format": "pcm",
                        "stream_format": "sse"}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        started.set()

        streaming = threading.Thread(target=stream, daemon=True)
        streaming.start()
        assert started.wait(120)
        assert until(lambda: http.get(f"/v1/audio/jobs/{job_id}").json()["progress"]["done"]
                     >= 1, timeout=120)
        two_nodes.cluster.remove_node(two_nodes.second_node, allow_graceful=False)
        removed = time.monotonic()
        streaming.join(60)
        assert not streaming.is_alive()
        kinds = [e["type"] for e in events]
        assert kinds[0] == "speech.audio.delta" and kinds[-1] == "error", kinds[-3:]
        after = http.post("/v1/audio/speech", json={
            "model": "piper", "input": "Spoken on the third node.", "response_format": "wav"})
        served = time.monotonic() - removed
        assert after.status_code == 200, after.text
        assert decode(after.content, "wav").duration > 0.8
        assert in_replicas(placed_name("piper"), node_id) == [third.node_id]
        card = until(lambda: (c := http.get(f"/v1/audio/jobs/{job_id}").json())["status"]
                     in ("done", "failed") and c, timeout=300)
        assert card and card["status"] == "done", card
        audio = decode(http.get(f"/v1/audio/jobs/{job_id}/audio").content, "wav")
    assert audio.duration > sentences * 2
    print(f"next request served {served:.1f} s after the node was removed")
