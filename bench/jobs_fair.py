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

import itertools
import random
import threading
import time
from typing import Any

import httpx

from bench.common import percentiles, run_benchmark, sentences, timed_phase, voxmux_process

ENV = {"VOXMUX_PRELOAD": "piper,kokoro", "VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_IDLE_TTL": "-1"}
SHORT = 150
"""`VOXMUX_JOBS_SEGMENT_CHARS` of the last row (0, the engine's limit, in the others)."""
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


def watch(client: httpx.Client, job_id: str, stop: threading.Event,
          ends: list[float]) -> None:
    """When each of the job's segments finished (polled every 20 ms)."""
    done = 0
    while not stop.is_set():
        now = client.get(f"/v1/audio/jobs/{job_id}").json()["progress"]["done"]
        ends += [time.perf_counter()] * (now - done)
        done = now
        time.sleep(0.02)


def measure_model(client: httpx.Client, model: str, rounds: int) -> dict[str, Any]:
    idle = []
    for _ in range(rounds):
        idle.append(first_audio(client, model))
        time.sleep(0.3)
    job = client.post("/v1/audio/jobs", json={
        "model": model, "voice": "alloy", "input": sentences(400),
        "response_format": "mp3"}).json()
    ends: list[float] = []
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(client, job["id"], stop, ends))
    watcher.start()
    while len(ends) < 1:
        time.sleep(0.05)
    busy, waited = [], []
    for _ in range(rounds):
        time.sleep(random.uniform(0.2, 2.0))
        sent = time.perf_counter()
        busy.append(first_audio(client, model))
        # the job segment under way when the request came: it ends at the first end after it
        waited.append(next((t for t in ends if t >= sent), sent) - sent)
    stop.set()
    watcher.join()
    client.delete(f"/v1/audio/jobs/{job['id']}", params={"purge": "true"})
    segments = [b - a for a, b in itertools.pairwise(ends)]
    return {"idle": percentiles(idle), "busy": percentiles(busy),
            "idle_all": [round(x, 3) for x in idle], "busy_all": [round(x, 3) for x in busy],
            "segment_left_at_request": [round(x, 3) for x in waited],
            "busy_minus_segment_left": [round(b - w, 3) for b, w in
                                        zip(busy, waited, strict=True)],
            "job_segment_seconds": percentiles(segments) if segments else None,
            "job_segment_max": round(max(segments), 2) if segments else None}


def measure(quick: bool) -> dict[str, Any]:
    rounds = 3 if quick else 8
    phases: dict[str, Any] = {}
    models: dict[str, Any] = {}
    random.seed(7)
    with voxmux_process(ENV) as server, httpx.Client(base_url=server.url, timeout=600) as client:
        for model in ("piper", "kokoro"):
            with timed_phase(model, phases):
                models[model] = measure_model(client, model, rounds)
    shorter = {**ENV, "VOXMUX_PRELOAD": "kokoro", "VOXMUX_JOBS_SEGMENT_CHARS": str(SHORT)}
    with voxmux_process(shorter) as server, \
            httpx.Client(base_url=server.url, timeout=600) as client:
        name = f"kokoro, job segments <= {SHORT} chars"
        with timed_phase(name, phases):
            models[name] = measure_model(client, "kokoro", rounds)
    return {"rounds": rounds, "sentence": SENTENCE, "models": models, "phases": phases}


def summary(data: dict[str, Any]) -> str:
    m = data["machine"]
    others = ", ".join(f"{name} {phase['other_work']['others']:.0%}"
                       for name, phase in data["phases"].items())
    lines = [
        "# First audio while a long-form job runs on the same model", "",
        f"{m['cpu_model']}, {m['cpus']} CPUs, {m['date']}. Reproduce: "
        "`.venv/bin/python -m bench.jobs_fair`.", "",
        f"Share of the machine other processes took during each phase: {others}.", "",
        f"One sentence (`{data['sentence']}`) as pcm on `POST /v1/audio/speech`, "
        f"{data['rounds']} requests per row, one after another; the busy ones are sent at "
        "random moments while a job of 400 sentences renders on the same model (one engine "
        "call at a time). A job segment takes background turns, so a request waits for the "
        "segment under way at most: *left of the segment* is how long that segment still ran "
        "when the request came (from the job's progress, polled every 20 ms), and *first audio "
        "minus it* is what the request took besides, to compare with idle.", "",
        "| model | idle first audio p50 / max (s) | job running: first audio p50 / max (s) | "
        "left of the segment under way p50 / max (s) | first audio minus it, max (s) | "
        "job segment p50 / max (s) |",
        "|---|---|---|---|---|---|",
    ]
    for model, row in data["models"].items():
        left = sorted(row["segment_left_at_request"])
        segment = row["job_segment_seconds"] or {"p50": 0.0}
        lines.append(
            f"| {model} | {row['idle']['p50']:.3f} / {max(row['idle_all']):.3f} | "
            f"{row['busy']['p50']:.3f} / {max(row['busy_all']):.3f} | "
            f"{left[len(left) // 2]:.3f} / {max(left):.3f} | "
            f"{max(row['busy_minus_segment_left']):.3f} | "
            f"{segment['p50']:.2f} / {row['job_segment_max']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_benchmark("jobs_fair", __doc__ or "", measure, summary)
