"""Server memory: RSS per loaded model, after idle unload against the pre-load baseline, and over a
soak of many requests. RSS is read from `/proc/<pid>/status` of the server subprocess and of the
helper processes it runs (the Japanese reader), summed.

The server starts with nothing preloaded, a short idle TTL and the cache off. The baseline is
taken once it has answered a few non-synthesis requests (route code warmed, no model touched).
Then, one model at a time: one short request loads it (RSS with the model), the idle TTL unloads
it (RSS after unload), and the same again: a second cycle shows whether anything accumulates.
What a first synthesis sets up for the life of the process (onnxruntime's global state and code
pages, the eSpeak NG library and data) stays, and is part of what "after unload" measures.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx

from bench.common import Server, voxmux_process

MB = 1_000_000
IDLE_TTL = 2.0


def settle(server: Server, seconds: float = 1.0) -> int:
    """RSS once the process has been quiet for a moment (the last of a few samples)."""
    time.sleep(seconds)
    return server.rss()


def speak(client: httpx.Client, model: str, text: str) -> None:
    response = client.post("/v1/audio/speech",
                           json={"model": model, "input": text, "response_format": "pcm"})
    response.raise_for_status()


def wait_unloaded(client: httpx.Client, model: str, timeout: float = 60) -> float:
    """Seconds until the model reports `unloaded`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if client.get(f"/v1/models/{model}").json()["status"] == "unloaded":
            return time.monotonic() - started
        time.sleep(0.2)
    raise RuntimeError(f"{model} was not unloaded within {timeout:g} s")


def memory_run(models: tuple[str, ...], soak_models: tuple[str, ...], soak_requests: int,
               warmup: int, sample_every: int) -> dict[str, Any]:
    env = {"VOXMUX_PRELOAD": "", "VOXMUX_IDLE_TTL": str(IDLE_TTL),
           "VOXMUX_CACHE_MAX_ITEMS": "0"}
    with voxmux_process(env) as server, httpx.Client(base_url=server.url, timeout=600) as client:
        for _ in range(3):
            client.get("/health")
            client.get("/v1/models")
        baseline = settle(server, 2.0)
        per_model: dict[str, dict[str, float]] = {}
        for model in models:
            before = server.rss()
            loaded, unloaded, unload_s = _cycle(server, client, model)
            again_loaded, again_unloaded, _ = _cycle(server, client, model)
            per_model[model] = {
                "before_mb": round(before / MB, 1),
                "loaded_mb": round(loaded / MB, 1),
                "model_mb": round((loaded - before) / MB, 1),
                "after_unload_mb": round(unloaded / MB, 1),
                "unload_wait_s": round(unload_s, 1),
                "second_loaded_mb": round(again_loaded / MB, 1),
                "second_after_unload_mb": round(again_unloaded / MB, 1),
            }
            print(f"  {model}: {per_model[model]}", flush=True)
        after_all = settle(server, 1.0)
        soaks = [_soak(server, client, model, soak_requests, warmup, sample_every)
                 for model in soak_models]
    return {
        "idle_ttl_s": IDLE_TTL,
        "baseline_mb": round(baseline / MB, 1),
        "models": per_model,
        "after_unload_mb": round(after_all / MB, 1),
        "after_unload_delta_mb": round((after_all - baseline) / MB, 1),
        "soaks": soaks,
    }


def _cycle(server: Server, client: httpx.Client, model: str) -> tuple[int, int, float]:
    """One request loads the model, the idle TTL unloads it: (RSS loaded, RSS after, wait)."""
    speak(client, model, "Memory check, one short sentence.")
    loaded = settle(server)
    waited = wait_unloaded(client, model)
    return loaded, settle(server), waited


def _soak(server: Server, client: httpx.Client, model: str, requests: int, warmup: int,
          sample_every: int) -> dict[str, Any]:
    """`requests` short, all different texts, one after another; RSS sampled on the way.

    Between requests the allocators hold more or less freed memory (onnxruntime's arena shrinks
    after each run and hands its chunks to glibc, which keeps some), so one sample can sit tens of
    MB above or below the next with nothing leaking. Growth is therefore the median of the last
    quarter of the samples minus the median of the first quarter: a leak moves it, noise does not.
    """
    def one(i: int) -> None:
        speak(client, model, f"Request number {i} of the soak test is a short sentence.")

    for i in range(warmup):
        one(-i - 1)
    start = settle(server, 0.5)
    samples = [(0, round(start / MB, 1))]
    started = time.perf_counter()
    for i in range(1, requests + 1):
        one(i)
        if i % sample_every == 0:
            samples.append((i, round(server.rss() / MB, 1)))
    wall = time.perf_counter() - started
    end = settle(server, 0.5)
    values = [mb for _, mb in samples]
    quarter = max(1, len(values) // 4)
    growth = statistics.median(values[-quarter:]) - statistics.median(values[:quarter])
    return {
        "model": model,
        "requests": requests,
        "warmup": warmup,
        "wall_s": round(wall, 1),
        "start_mb": round(start / MB, 1),
        "end_mb": round(end / MB, 1),
        "min_mb": min(values),
        "max_mb": max(values),
        "growth_mb": round(growth, 1),
        "growth_statistic": f"median of the last {quarter} samples - median of the first {quarter}",
        "samples": samples,
    }
