"""What OpenTelemetry tracing costs: throughput and first audio with traces off and on.

Run: `.venv/bin/python -m bench.tracing [--quick]` (starts its own servers; writes
bench/results/tracing.json and tracing.md, about four minutes). For each model, two `voxmux
serve` processes, cpu profile, the model preloaded, the cache off: one with traces off (no
`OTEL_*`), one exporting every span over OTLP/HTTP to a receiver in this process
(`OTEL_EXPORTER_OTLP_ENDPOINT`), which decodes and counts them as a collector would. Each round
sends short one-to-three-sentence requests, 4 at a time, to one server then the other (wav,
streamed), and the order alternates between rounds, so load from the rest of the machine falls
on both alike. Reported per server: requests and audio seconds per wall second over all rounds,
first-audio p50 (the first body bytes), the server's CPU seconds per request (what the spans
cost, whatever else the machine runs), and the spans received. eSpeak NG is the worst case (its
requests cost the least, so the spans' share is the largest); Piper stands for a neural engine.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.common import (
    Server,
    run_benchmark,
    sentences,
    timed_phase,
    tree_cpu_seconds,
    voxmux_process,
)

CONCURRENCY = 4
MODELS = {"espeak": ("en-us", 6, 40), "piper": ("en_US-joe-medium", 4, 16)}
"""Per model: its voice, the rounds and the requests per round."""
COMMON = {"VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_IDLE_TTL": "-1"}
RATE = 22_050
"""Both models' rate: wav bytes to audio seconds."""


@contextmanager
def span_counter() -> Iterator[tuple[str, list[int]]]:
    """An OTLP/HTTP receiver on a free port: (endpoint, [spans received])."""
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = ExportTraceServiceRequest()
            request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
            count[0] += sum(len(s.spans) for r in request.resource_spans
                            for s in r.scope_spans)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", count
    finally:
        server.shutdown()
        server.server_close()


def one(client: httpx.Client, model: str, text: str) -> tuple[float, float]:
    """(seconds to the first audio bytes, audio seconds) of one streamed wav request."""
    started = time.perf_counter()
    first, size = 0.0, 0
    with client.stream("POST", "/v1/audio/speech", json={
            "model": model, "voice": MODELS[model][0], "input": text, "response_format": "wav"}
    ) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if chunk and not first:
                first = time.perf_counter() - started
            size += len(chunk)
    return first, (size - 44) / 2 / RATE


def batch(server: Server, model: str, requests: int) -> dict[str, Any]:
    texts = [f"Request {i} {uuid.uuid4().hex[:6]}. {sentences(1 + i % 3)}"
             for i in range(requests)]
    cpu = tree_cpu_seconds(server.pid)
    started = time.perf_counter()
    with httpx.Client(base_url=server.url, timeout=60) as client, \
            ThreadPoolExecutor(CONCURRENCY) as pool:
        results = list(pool.map(lambda text: one(client, model, text), texts))
    return {"seconds": time.perf_counter() - started,
            "cpu_seconds": tree_cpu_seconds(server.pid) - cpu,
            "first_audio": [r[0] for r in results], "audio_seconds": sum(r[1] for r in results),
            "requests": requests}


def totals(batches: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = sum(b["seconds"] for b in batches)
    requests = sum(b["requests"] for b in batches)
    return {
        "requests": requests,
        "requests_per_s": round(requests / seconds, 2),
        "audio_s_per_s": round(sum(b["audio_seconds"] for b in batches) / seconds, 1),
        "first_audio_p50_ms": round(statistics.median(
            [f for b in batches for f in b["first_audio"]]) * 1000, 1),
        "server_cpu_ms_per_request": round(
            sum(b["cpu_seconds"] for b in batches) / requests * 1000, 1),
        "rounds": [round(b["requests"] / b["seconds"], 2) for b in batches],
    }


def compare(model: str, endpoint: str, spans: list[int], quick: bool) -> dict[str, Any]:
    """One model's rounds against a server with traces off and one with them on."""
    _, rounds, requests = MODELS[model]
    rounds, requests = (1, 8) if quick else (rounds, requests)
    phases: dict[str, Any] = {}
    env = {**COMMON, "VOXMUX_PRELOAD": model}
    with ExitStack() as stack:
        servers = {
            "off": stack.enter_context(voxmux_process({**env, "VOXMUX_OTEL": "false"})),
            "on": stack.enter_context(voxmux_process({
                **env, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_SERVICE_NAME": "voxmux-bench"})),
        }
        for server in servers.values():
            batch(server, model, CONCURRENCY)  # warm: first calls, threads, connections
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        load = [Path("/proc/loadavg").read_text().split()[0]]
        before = spans[0]
        with timed_phase("rounds", phases):
            for index in range(rounds):
                order = ("off", "on") if index % 2 == 0 else ("on", "off")
                for mode in order:
                    runs[mode].append(batch(servers[mode], model, requests))
        load.append(Path("/proc/loadavg").read_text().split()[0])
        time.sleep(6)  # the batch processor's 5 s schedule: the last spans leave
        received = spans[0] - before
    off, on = totals(runs["off"]), totals(runs["on"])
    return {
        "requests_per_round": requests, "rounds": rounds, "off": off,
        "on": {**on, "spans_received": received},
        "throughput_change_pct": round((on["requests_per_s"] / off["requests_per_s"] - 1) * 100,
                                       1),
        "cpu_change_pct": round((on["server_cpu_ms_per_request"]
                                 / off["server_cpu_ms_per_request"] - 1) * 100, 1),
        "others": phases["rounds"]["other_work"]["others"], "load_average": load,
    }


def measure(quick: bool) -> dict[str, Any]:
    with span_counter() as (endpoint, spans):
        models = {model: compare(model, endpoint, spans, quick) for model in MODELS}
    return {"concurrency": CONCURRENCY, "format": "wav", "models": models}


def summary(result: dict[str, Any]) -> str:
    lines = [
        "# Tracing cost",
        "",
        "Per model, rounds of short requests (1-3 sentences, wav, streamed), "
        f"{result['concurrency']} at a time, cache off, against a server with traces off and "
        "one exporting every span over OTLP/HTTP; the order alternates between rounds. "
        f"Machine: {result['machine']['cpus']} CPUs, {result['machine']['cpu_model']}.",
        "",
        "| model | traces | requests/s | audio s/s | first audio p50 | server CPU per request "
        "| per round (req/s) |",
        "|---|---|---|---|---|---|---|",
    ]
    notes = []
    for model, run in result["models"].items():
        for name in ("off", "on"):
            row = run[name]
            lines.append(
                f"| {model} | {name} | {row['requests_per_s']} | {row['audio_s_per_s']} | "
                f"{row['first_audio_p50_ms']} ms | {row['server_cpu_ms_per_request']} ms | "
                f"{', '.join(str(r) for r in row['rounds'])} |")
        on = run["on"]
        notes.append(
            f"- {model}: {run['rounds']} rounds of {run['requests_per_round']}; throughput with "
            f"traces on {run['throughput_change_pct']:+.1f} % (target: within 3 %), server CPU "
            f"per request {run['cpu_change_pct']:+.1f} %; spans received "
            f"{on['spans_received']} ({on['spans_received'] / on['requests']:.1f} per request, "
            f"warm-up included); other work took {run['others']:.0%} of the machine (1-minute "
            f"load average {' then '.join(run['load_average'])}).")
    return "\n".join([*lines, "", *notes, ""])


if __name__ == "__main__":
    run_benchmark("tracing", __doc__.split("\n\n")[0], measure, summary)
