"""What Ray Serve costs and gives on this machine: `voxmux serve --ray` against `voxmux serve`.

    .venv/bin/python -m bench.ray_overhead      # about four minutes; writes bench/results/ray.json

Same texts, same voice (Piper), pcm, cache off, both on this machine at once (the single process
in a subprocess, a local Ray cluster of 2 CPUs in this one), the systems taking turns:
- latency: one request at a time, 5 sentences; the ratio of medians is the Ray path's overhead
  (HTTP proxy -> ingress replica -> engine replica -> back, audio through Ray's object store);
- throughput: 4 clients at once, audio seconds per wall second: the single process
  (`VOXMUX_CONCURRENCY` 1) against one engine replica holding both CPUs, then that replica
  against two replicas of one CPU each (the same cores; each replica runs onnxruntime on the
  CPUs Ray granted it);
- where the CPU goes under that load: CPU seconds per audio second of each process (the single
  process; the engine replica, the ingress, Serve's proxy and Ray's own processes), and of the
  busiest threads of the server and of the engine replica (the one calling onnxruntime, then
  onnxruntime's own);
- first audio of 8 and of 16 simultaneous streams, three bursts each, on the single process and
  on one engine replica of the same shape (both CPUs, one request rendering at a time): p50, p95
  and the last stream's, and the ratio of the p50s;
- first audio of 8 simultaneous streams with autoscaling on (one replica of one CPU at start, at
  most two, the default delays): p50 and p95 over the bursts, and how many engine replicas ran
  after each;
- failover: an engine replica killed (`SIGKILL`) while it streams, then short requests one after
  another: seconds from the kill to the first one served whole, with two replicas (the other
  one serves) and with one (Serve starts a replacement, which loads the model);
- interference, without Ray: Piper in this process on two onnxruntime threads, rendering the
  same sentences alone and beside a process that keeps a quarter of one core busy (Ray's own
  processes took about that under load), rounds alternating.
The share of the machine other processes and the hypervisor took is recorded with each phase:
other engineers use this machine too.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

from app.cluster import launch
from app.settings import Settings
from bench.common import (
    ROOT,
    CpuByProcess,
    OtherWork,
    free_port,
    percentiles,
    sentences,
    voxmux_server,
    write_result,
)
from bench.load import throughput
from bench.systems import System, VoxMuxClient

SENTENCES = 5
LATENCY_ROUNDS = 9
CLIENTS = 4
THROUGHPUT_REQUESTS = 24
THROUGHPUT_ROUNDS = 2
BURST = 8
BURSTS = 3
BURST_SIZES = (8, 16)
SINGLE = {"VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_PRELOAD": "piper", "VOXMUX_QUEUE_SIZE": "32",
          "VOXMUX_CLIENT_MAX_REQUESTS": "32"}
"""The single process: a burst of 16 from one client fits (the default share of a client is
8 requests in progress)."""
PROCESSES = {"engine replica": "ServeReplica:voxmux:VoxMuxEngines",
             "ingress": "ServeReplica:voxmux:VoxMux", "proxy": "ProxyActor",
             "single process": "app.cli serve"}
"""Command-line fragments of the processes whose CPU is told apart (first match wins); the rest
of the processes under the benchmark (Ray's controller, raylet, GCS, agents) are `other`."""
HOG_SHARE = 0.25
"""Of one core, what the interfering process keeps busy."""
INTERFERENCE_ROUNDS = 4


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


def loads(systems: list[System], offset: int, audio_s: float) -> dict[str, dict[str, float]]:
    """Each system drains `THROUGHPUT_REQUESTS` with `CLIENTS` clients, `THROUGHPUT_ROUNDS`
    times in turn; pooled: audio seconds over wall seconds."""
    runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    spent: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
    for round_ in range(THROUGHPUT_ROUNDS):
        for index, system in enumerate(systems[round_ % 2:] + systems[: round_ % 2]):
            batch = texts(THROUGHPUT_REQUESTS, offset + 100 * (2 * round_ + index))
            cpu = CpuByProcess(PROCESSES)
            runs[system.name].append(throughput(system, CLIENTS, batch,
                                                dict.fromkeys(batch, audio_s)))
            spent[system.name].append(cpu.seconds())
    pooled = {}
    for name, parts in runs.items():
        wall = sum(p["wall_s"] for p in parts)
        audio = sum(p["audio_s_per_s"] * p["wall_s"] for p in parts)
        cpu = sum(p["cpu_s_per_audio_s"] * p["audio_s_per_s"] * p["wall_s"] for p in parts)
        pooled[name] = {"requests": sum(p["requests"] for p in parts), "wall_s": round(wall, 2),
                        "audio_s_per_s": round(audio / wall, 3),
                        "cpu_s_per_audio_s": round(cpu / audio, 3),
                        "cpu_s_per_audio_s_by_process": by_process(spent[name], audio, wall)}
    return pooled


def by_process(samples: list[dict[str, Any]], audio: float, wall: float) -> dict[str, Any]:
    """Pooled `CpuByProcess` samples: each group's CPU seconds per audio second (groups with
    under 0.1 s left out) and, for the server and the engine replica, the share of the wall
    time each of their three busiest threads was on a CPU."""
    groups: dict[str, float] = {}
    threads: dict[str, list[float]] = {}
    for sample in samples:
        for group, seconds in sample["groups"].items():
            groups[group] = groups.get(group, 0.0) + seconds
        for group, busiest in sample["threads"].items():
            pooled = threads.setdefault(group, [0.0] * len(busiest))
            threads[group] = [a + b for a, b in zip(pooled, busiest, strict=False)]
    return {"processes": {g: round(s / audio, 4) for g, s in groups.items() if s >= 0.1},
            "busiest_threads_busy": {g: [round(s / wall, 2) for s in busiest]
                                     for g, busiest in threads.items()
                                     if g in ("single process", "engine replica")}}


def interference(rounds: int) -> dict[str, Any]:
    """Piper on two onnxruntime threads in this process, the same sentences alone and beside
    a process keeping `HOG_SHARE` of one core busy, alternating: wall and CPU seconds of each."""
    from engines.base import SynthesisRequest
    from engines.onnx import RuntimeOptions
    from engines.piper import PiperEngine

    engine = PiperEngine(None, RuntimeOptions(intra_op_threads=2))
    engine.load()
    batch = [f"Item {i}. {sentences(1)}" for i in range(12)]
    hog = ("import time\nwhile True:\n    t = time.perf_counter()\n"
           f"    while time.perf_counter() - t < {HOG_SHARE} * 0.005: pass\n"
           f"    time.sleep({1 - HOG_SHARE} * 0.005)\n")

    def render() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for text in batch:
            engine.synthesize(SynthesisRequest(text=text, voice=engine.default_voice))
        return time.perf_counter() - wall, time.process_time() - cpu

    render()  # warm up
    measured: dict[str, list[tuple[float, float]]] = {"alone": [], "beside": []}
    try:
        for _ in range(rounds):
            measured["alone"].append(render())
            other = subprocess.Popen([sys.executable, "-c", hog])
            try:
                time.sleep(0.2)
                measured["beside"].append(render())
            finally:
                other.kill()
                other.wait()
    finally:
        engine.unload()
    medians = {name: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
               for name, runs in measured.items()}
    return {"hog_share_of_one_core": HOG_SHARE, "sentences": len(batch), "rounds": rounds,
            "wall_s": {k: round(v[0], 3) for k, v in medians.items()},
            "cpu_s": {k: round(v[1], 3) for k, v in medians.items()},
            "wall beside / alone": round(medians["beside"][0] / medians["alone"][0], 3),
            "cpu beside / alone": round(medians["beside"][1] / medians["alone"][1], 3),
            "machine share taken by the hog": round(HOG_SHARE / (os.cpu_count() or 1), 3)}


def bursts(system: System, offset: int, engines: Any = None) -> dict[str, Any]:
    """`BURSTS` times `BURST` requests at once: their first audio (p50, p95 over all of
    them) and, on a cluster, the engine replicas running after each burst."""
    firsts: list[float] = []
    replicas = []
    for index in range(BURSTS):
        batch = texts(BURST, offset + BURST * index)
        with concurrent.futures.ThreadPoolExecutor(BURST) as pool:
            firsts += [s.ttfa for s in pool.map(system.request, batch)]
        if engines is not None:
            replicas.append(engines())
    summary = percentiles(firsts)
    out: dict[str, Any] = {"first_audio_ms": {k: round(summary[k] * 1000) for k in
                                              ("p50", "p95")}, "streams": len(firsts)}
    if replicas:
        out["engine_replicas_after_each_burst"] = replicas
    return out


def burst_sizes(systems: list[System], offset: int) -> dict[str, Any]:
    """For each of `BURST_SIZES`, `BURSTS` bursts of that many requests at once on each
    system in turn: first audio p50, p95 and last (ms) over all of them, and ray / single."""
    found: dict[str, Any] = {}
    for size in BURST_SIZES:
        firsts: dict[str, list[float]] = {s.name: [] for s in systems}
        for index in range(BURSTS):
            for system in systems[index % 2:] + systems[: index % 2]:
                batch = texts(size, offset + 100 * index + 1000 * size)
                with concurrent.futures.ThreadPoolExecutor(size) as pool:
                    firsts[system.name] += [s.ttfa for s in pool.map(system.request, batch)]
        row: dict[str, Any] = {}
        for name, values in firsts.items():
            summary = percentiles(values)
            row[name] = {"p50_ms": round(summary["p50"] * 1000), "p95_ms":
                         round(summary["p95"] * 1000), "last_ms": round(max(values) * 1000),
                         "streams": len(values)}
        names = [s.name for s in systems]
        row[f"{names[1]} / {names[0]} p50"] = round(
            row[names[1]]["p50_ms"] / row[names[0]]["p50_ms"], 2)
        found[str(size)] = row
    return found


def engine_pids() -> list[int]:
    """The process ids of the engine replicas."""
    import ray

    from app.cluster.app import APP_NAME, ENGINES

    pids = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        if actor["name"].startswith(f"SERVE_REPLICA::{APP_NAME}#{ENGINES}#"):
            handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
            pids.append(ray.get(handle.__ray_call__.remote(lambda _: os.getpid())))
    return pids


def failover(url: str) -> dict[str, Any]:
    """A long stream started, one engine replica killed once its first audio arrived, then
    short requests one after another (each given 60 s): seconds from the kill to the first one
    answered whole, and how many failed before it."""
    import signal
    import threading

    pids = engine_pids()
    streaming = threading.Event()

    def stream() -> None:
        with contextlib.suppress(httpx.HTTPError), httpx.Client(timeout=120) as http, \
                http.stream("POST", url + "/v1/audio/speech", json={
                    "model": "piper", "input": f"Failover. {sentences(20)}",
                    "response_format": "pcm"}) as response:
            for _ in response.iter_bytes():
                streaming.set()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    if not streaming.wait(60):
        raise RuntimeError("the stream to kill did not start")
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    killed = time.perf_counter()
    failed = 0
    with httpx.Client(timeout=60) as http:
        while time.perf_counter() - killed < 120:
            try:
                answer = http.post(url + "/v1/audio/speech", json={
                    "model": "piper", "input": f"After the kill {failed}.",
                    "response_format": "pcm"})
                if answer.status_code == 200 and answer.content:
                    break
            except httpx.HTTPError:
                pass
            failed += 1
            time.sleep(0.05)
    served = time.perf_counter() - killed
    thread.join(30)
    return {"replicas": len(pids), "next_served_s": round(served, 2),
            "failed_before": failed}


def ray_settings(port: int, **options: Any) -> Settings:
    values: dict[str, Any] = {
        "preload": ["piper"], "port": port, "cache_max_items": 0,
        "cache_dir": ROOT / "var" / "cache", "ray_cpus": 2,
        "ray_object_store_bytes": 200 * 2**20, "ray_ingress_cpus": 0,
        "ray_models_per_replica": 1, "concurrency": 1, "queue_size": 16, "log_level": "warning",
        "ray_engine_replicas": 1, "ray_engine_max_replicas": 1, "ray_engine_cpus": 2}
    return Settings(**{**values, **options})


def redeploy(settings: Settings, replicas: int) -> None:
    """The application again with other replica shapes: deleted first, so the old replicas'
    CPUs are free for the new ones (a rolling update on a full 2-CPU cluster would wait)."""
    from ray import serve

    from app.cluster.app import APP_NAME

    serve.delete(APP_NAME)
    url = launch.deploy(settings)
    wait_ready(url, replicas)


def running_engines(url: str) -> int:
    body = httpx.get(url + "/health", timeout=10).json()
    return int(body["cluster"]["deployment"]["replica_states"].get("RUNNING", 0))


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
                              "requests_per_run": THROUGHPUT_REQUESTS,
                              "runs_per_system": THROUGHPUT_ROUNDS}
    started = time.perf_counter()
    settings = ray_settings(free_port())
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
            runs = loads([single, ray1], 2000, audio_s)
            result["machine_single_vs_one_replica"] = work.shares()
            work = OtherWork()
            result["burst"] = burst_sizes([single, ray1], 9000)
            result["machine_burst"] = work.shares()
        redeploy(ray_settings(settings.port, ray_engine_replicas=2, ray_engine_max_replicas=2,
                              ray_engine_cpus=1), replicas=2)
        ray2 = VoxMuxClient(url, name="ray-2")
        ray2.request(texts(1, 1)[0])
        work = OtherWork()
        runs |= {k: v for k, v in loads([ray2], 5000, audio_s).items()}
        result["machine_two_replicas"] = work.shares()
        result["failover"] = [failover(url)]
        redeploy(ray_settings(settings.port, ray_engine_replicas=1, ray_engine_max_replicas=2,
                              ray_engine_cpus=1), replicas=1)
        scaling = VoxMuxClient(url, name="ray-autoscaling")
        scaling.request(texts(1, 1)[0])
        work = OtherWork()
        result["simultaneous"] = {"ray-autoscaling": bursts(
            scaling, 7000, lambda: running_engines(url))}
        result["machine_simultaneous_ray"] = work.shares()
        wait_ready(url, replicas=1)
        result["failover"].append(failover(url))
    finally:
        launch.stop(local=True)
    work = OtherWork()
    result["interference"] = interference(INTERFERENCE_ROUNDS)
    result["machine_interference"] = work.shares()
    result["throughput"] = runs
    rate = {k: r["audio_s_per_s"] for k, r in runs.items()}
    result["throughput_ratios"] = {
        "ray-1 / single": round(rate["ray-1"] / rate["single"], 3),
        "ray-2 / ray-1": round(rate["ray-2"] / rate["ray-1"], 3),
    }
    result["setup"] = {
        "single": "voxmux serve, concurrency 1, onnxruntime's own thread count (2 cores)",
        "ray-1": "one engine replica, num_cpus 2 (2 onnxruntime threads), ingress 0 CPUs",
        "ray-2": "two engine replicas, num_cpus 1 each (1 onnxruntime thread each)",
        "ray-autoscaling": "1..2 engine replicas of num_cpus 1, target 1 ongoing request, "
                           "upscale delay 5 s (the defaults)",
    }
    path = write_result("ray", result)
    print(path.read_text())


if __name__ == "__main__":
    main()
