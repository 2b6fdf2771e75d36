"""An interactive request's first audio while a long-form job renders on the same model.

    .venv/bin/python -m bench.jobs_fair            # writes bench/results/jobs_fair.json and .md
    .venv/bin/python -m bench.jobs_fair --quick    # a smoke test; numbers not meant

`voxmux serve` (cpu profile: one engine call per model at a time) with Piper and Kokoro loaded.
For each model: first audio of a one-sentence `POST /v1/audio/speech` (pcm, read as a stream)
with the model idle, then the same while a job (`POST /v1/audio/jobs`, a long text) renders on
that model; requests are sent at random moments of the job's segments. The job's segments take
background turns: an interactive request waits for the segment under way at most, so its added
wait is bounded by one job segment's time (reported beside it: the job's seconds per segment).
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx

from bench.common import percentiles, run_benchmark, sentences, timed_phase, voxmux_process

ENV = {"VOXMUX_PRELOAD": "piper,kokoro", "VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_IDLE_TTL": "-1"}
SENTENCE = "The next train leaves from platform four in ten minutes."


def first_audio(client: httpx.Client, model: str) -> float:
    started = time.perf_counter()
    with client.stream("POST", "/v1/audio/speech", json={
            "model": model, "input": SENTENCE, "voice": "alloy",
            "response_format": "pcm"}) as response:
        response.raise_for_status()
        first = None
        for chunk in response.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - started
    assert first is not None
    return first


def measure_model(client: httpx.Client, model: str, rounds: int) -> dict[str, Any]:
    idle = []
    for _ in range(rounds):
        idle.append(first_audio(client, model))
        time.sleep(0.3)
    job = client.post("/v1/audio/jobs", json={
        "model": model, "voice": "alloy", "input": sentences(400),
        "response_format": "mp3"}).json()
    while client.get(f"/v1/audio/jobs/{job['id']}").json()["progress"]["done"] < 1:
        time.sleep(0.1)
    started = time.perf_counter()
    busy = []
    for _ in range(rounds):
        time.sleep(random.uniform(0.2, 2.0))
        busy.append(first_audio(client, model))
    state = client.get(f"/v1/audio/jobs/{job['id']}").json()
    client.delete(f"/v1/audio/jobs/{job['id']}", params={"purge": "true"})
    done = state["progress"]["done"]
    per_segment = (time.perf_counter() - started) / max(1, done - 1)
    return {"idle": percentiles(idle), "busy": percentiles(busy),
            "idle_all": [round(x, 3) for x in idle], "busy_all": [round(x, 3) for x in busy],
            "job_segments_done": done, "job_seconds_per_segment": round(per_segment, 2),
            "job_status_at_end": state["status"]}


def measure(quick: bool) -> dict[str, Any]:
    rounds = 3 if quick else 8
    phases: dict[str, Any] = {}
    models: dict[str, Any] = {}
    random.seed(7)
    with voxmux_process(ENV) as server, httpx.Client(base_url=server.url, timeout=600) as client:
        for model in ("piper", "kokoro"):
            with timed_phase(model, phases):
                models[model] = measure_model(client, model, rounds)
    return {"rounds": rounds, "sentence": SENTENCE, "models": models, "phases": phases}


def summary(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# First audio while a long-form job runs on the same model", "",
        f"{m['cpu_model']}, {m['cpus']} CPUs, {m['date']}. Reproduce: "
        "`.venv/bin/python -m bench.jobs_fair`.", "",
        f"One sentence (`{data['sentence']}`) as pcm on `POST /v1/audio/speech`, "
        f"{data['rounds']} requests per row; the busy requests are sent at random moments "
        "while a job of 400 sentences renders on the same model (one engine call at a time). "
        "A job segment takes background turns: the request waits at most for the segment under "
        "way.", "",
        "| model | idle p50 (s) | idle max (s) | job running p50 (s) | job running max (s) | "
        "job: seconds per segment |",
        "|---|---|---|---|---|---|",
    ]
    for model, row in data["models"].items():
        lines.append(
            f"| {model} | {row['idle']['p50']:.3f} | {max(row['idle_all']):.3f} | "
            f"{row['busy']['p50']:.3f} | {max(row['busy_all']):.3f} | "
            f"{row['job_seconds_per_segment']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_benchmark("jobs_fair", __doc__ or "", measure, summary)
