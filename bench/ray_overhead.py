"""What Ray Serve costs and gives on this machine: `voxmux serve --ray` against `voxmux serve`.

    .venv/bin/python -m bench.ray_overhead      # a few minutes; writes bench/results/ray.json

Same texts, same voice (Piper), pcm, cache off, both on this machine at once (the single process
in a subprocess, a local Ray cluster of 2 CPUs in this one), measured in interleaved rounds:
- latency: one request at a time, 5 sentences; the ratio of medians is the Ray path's overhead
  (HTTP proxy -> ingress replica -> engine replica -> back, audio through Ray's object store);
- throughput: 4 clients at once, audio seconds per wall second, with one engine replica and
  with two (each replica one engine call at a time, one more request waiting; a third goes to
  the other replica), against the single process at `VOXMUX_CONCURRENCY` 1 and 2.
The share of the machine other processes and the hypervisor took is recorded with each phase:
other engineers use this machine too.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx

from app.cluster import launch
from app.settings import Settings
from bench.common import ROOT, OtherWork, free_port, sentences, voxmux_server, write_result
from bench.load import throughput
from bench.systems import System, VoxMuxClient

SENTENCES = 5
LATENCY_ROUNDS = 15
CLIENTS = 4
THROUGHPUT_REQUESTS = 24
SINGLE = {"VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_PRELOAD": "piper"}


def texts(count: int, offset: int) -> list[str]:
    """Distinct texts of (nearly) one length: a different opening number each."""
    return [f"Item {offset + i}. {sentences(SENTENCES)}" for i in range(count)]


def latency(systems: list[System], rounds: int) -> dict[str, float]:
    """Median whole-response seconds, one request at a time, systems alternating first."""
    totals: dict[str, list[float]] = {s.name: [] for s in systems}
    for index in range(rounds):
        text = texts(1, 1000 + index)[0]
        for system in systems[index % 2:] + systems[: index % 2]:
            totals[system.name].append(system.request(text).total)
    return {name: statistics.median(values) for name, values in totals.items()}


def load(system: System, offset: int, audio_s: float) -> dict[str, Any]:
    batch = texts(THROUGHPUT_REQUESTS, offset)
    return throughput(system, CLIENTS, batch, dict.fromkeys(batch, audio_s))


def ray_settings(replicas: int, port: int) -> Settings:
    return Settings(
        preload=["piper"], port=port, cache_max_items=0, cache_dir=ROOT / "var" / "cache",
        ray_cpus=2, ray_object_store_bytes=200 * 2**20, ray_engine_replicas=replicas,
        ray_engine_cpus=1, ray_ingress_cpus=0, ray_models_per_replica=1, concurrency=1,
        queue_size=16, ray_engine_max_ongoing=2, log_level="warning")


def wait_ready(url: str, replicas: int) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            body = httpx.get(url + "/health", timeout=10).json()
            if body["status"] == "ok" and len(body["cluster"]["replicas"]) == replicas:
                return
        except (httpx.TransportError, ValueError, KeyError, TypeError):
            pass
        time.sleep(0.5)
    raise RuntimeError("the Ray deployment did not become ready")


def main() -> None:
    result: dict[str, Any] = {"sentences": SENTENCES, "clients": CLIENTS,
                              "requests_per_run": THROUGHPUT_REQUESTS}
    started = time.perf_counter()
    settings = ray_settings(1, free_port())
    launch.start_local(settings, log_to_driver=False)
    try:
        url = launch.deploy(settings)
        wait_ready(url, replicas=1)
        result["cluster_up_s"] = round(time.perf_counter() - started, 1)
        ray1 = VoxMuxClient(url, name="ray-1")
        with voxmux_server(SINGLE) as single_url:
            single = VoxMuxClient(single_url, name="single")
            audio_s = single.request(texts(1, 0)[0]).audio_s  # also warms both up
            ray1.request(texts(1, 1)[0])
            work = OtherWork()
            p50 = latency([single, ray1], LATENCY_ROUNDS)
            result["latency"] = {
                "p50_ms": {k: round(v * 1000, 1) for k, v in p50.items()},
                "ray / single": round(p50["ray-1"] / p50["single"], 3),
                "machine": work.shares(),
            }
            work = OtherWork()
            runs = {"single": load(single, 2000, audio_s), "ray-1": load(ray1, 3000, audio_s)}
            result["machine_one_replica"] = work.shares()
        with voxmux_server({**SINGLE, "VOXMUX_CONCURRENCY": "2"}) as single2_url:
            single2 = VoxMuxClient(single2_url, name="single-c2")
            single2.request(texts(1, 0)[0])
            launch.deploy(ray_settings(2, settings.port))
            wait_ready(url, replicas=2)
            ray2 = VoxMuxClient(url, name="ray-2")
            ray2.request(texts(1, 1)[0])
            work = OtherWork()
            runs["single-c2"] = load(single2, 4000, audio_s)
            runs["ray-2"] = load(ray2, 5000, audio_s)
            result["machine_two_replicas"] = work.shares()
    finally:
        launch.stop(local=True)
    result["throughput"] = {k: {m: round(v, 3) for m, v in r.items()} for k, r in runs.items()}
    rate = {k: r["audio_s_per_s"] for k, r in runs.items()}
    result["throughput_ratios"] = {
        "ray-1 / single": round(rate["ray-1"] / rate["single"], 3),
        "ray-2 / ray-1": round(rate["ray-2"] / rate["ray-1"], 3),
        "ray-2 / single-c2": round(rate["ray-2"] / rate["single-c2"], 3),
    }
    path = write_result("ray", result)
    print(path.read_text())


if __name__ == "__main__":
    main()
