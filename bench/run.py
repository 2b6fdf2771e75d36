"""VoxMux against the raw engine (the limit) and piper-tts's own server (the peer), in one run.

    make bench                       # or: .venv/bin/python -m bench.run
    .venv/bin/python -m bench.run --quick    # a smoke test in about a minute; numbers not meant

Same machine, same Piper voice (en_US-joe-medium), same texts. Phases:
1. comparison: the raw engine in this process, `voxmux serve` (cache off, concurrency 8 and, in a
   full run, a second one at the default concurrency 1) and the peer, all up at once and measured
   interleaved: latency p50/p95/p99 and time to first audio for 1, 5 and 20 sentences (VoxMux as
   pcm, the figure the targets use, and as mp3, OpenAI's default), then throughput (pcm) at
   concurrency 1, 2, 4 and 8;
2. cache: hit against miss latency (`bench.cache_latency`) on a server with the cache on;
3. memory: RSS per loaded model, after idle unload against the pre-load baseline, and over a soak.
Writes `bench/results/run.json`, `summary.md` and PNG plots (`--quick`: `bench/results/quick/`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from app.settings import load_settings
from bench import load, memory, peer
from bench.cache_latency import CACHE_ON, cache_rows
from bench.common import (
    RESULTS,
    ROOT,
    OtherWork,
    voxmux_process,
    write_result,
)
from bench.systems import PeerClient, RawPiper, System, VoxMuxClient

MB = 1_000_000


@dataclass(frozen=True)
class Plan:
    rounds: dict[str, int]
    """Measured requests per system and text length (after one warm-up each)."""
    levels: tuple[int, ...]
    throughput_sentences: int
    per_worker: int
    """Throughput requests per worker and round at each level (at least `min_requests`)."""
    min_requests: int
    throughput_requests: int
    """Throughput requests per system at each level, in as many rounds as that takes."""
    single_slot_server: bool
    """Also measure a server at the cpu profile's default concurrency (1)."""
    cache_lengths: tuple[int, ...]
    cache_rounds: int
    memory_models: tuple[str, ...]
    soak_models: tuple[str, ...]
    """One soak per model, one after another on the memory phase's server."""
    soak_requests: int
    soak_warmup: int
    soak_sample_every: int


FULL = Plan(
    rounds={"short": 60, "medium": 20, "long": 10}, levels=(1, 2, 4, 8), throughput_sentences=5,
    per_worker=2, min_requests=4, throughput_requests=64, single_slot_server=True,
    cache_lengths=(1, 5, 20), cache_rounds=2, memory_models=("piper", "kokoro", "espeak"),
    soak_models=("espeak", "piper"), soak_requests=1000, soak_warmup=100, soak_sample_every=50,
)
QUICK = Plan(
    rounds={"short": 3, "medium": 2, "long": 1}, levels=(1, 2), throughput_sentences=1,
    per_worker=1, min_requests=2, throughput_requests=2, single_slot_server=False,
    cache_lengths=(1,), cache_rounds=1, memory_models=("piper", "espeak"),
    soak_models=("espeak",), soak_requests=100, soak_warmup=10, soak_sample_every=25,
)

COMPARE_ENV = {"VOXMUX_PRELOAD": "piper", "VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_IDLE_TTL": "-1",
               "VOXMUX_QUEUE_SIZE": "64"}


PHASES = ("compare", "cache", "memory")


@contextmanager
def phase(name: str, runs: dict[str, dict[str, Any]]) -> Iterator[None]:
    """Times a phase and keeps with its result how much of the machine other work took."""
    print(f"== {name}", flush=True)
    started = time.perf_counter()
    other = OtherWork()
    yield
    runs[name] = {"seconds": round(time.perf_counter() - started, 1),
                  "at": time.strftime("%Y-%m-%d %H:%M"),
                  "other_work": other.shares()}
    print(f"== {name} done in {runs[name]['seconds']} s, other work {runs[name]['other_work']}",
          flush=True)


def _previous(path: Path, quick: bool) -> dict[str, Any]:
    """The last result of the same kind, whose phases a `--skip` run keeps."""
    if not path.exists():
        return {}
    previous: dict[str, Any] = json.loads(path.read_text())
    return previous if previous.get("quick") == quick else {}


def compare(plan: Plan, logs: Path) -> dict[str, Any]:
    settings = load_settings("cpu")
    with ExitStack() as stack:
        vox = stack.enter_context(voxmux_process({**COMPARE_ENV, "VOXMUX_CONCURRENCY": "8"}))
        single = (stack.enter_context(voxmux_process({**COMPARE_ENV, "VOXMUX_CONCURRENCY": "1"}))
                  if plan.single_slot_server else None)
        peer_server = stack.enter_context(peer.peer_server(logs / "peer.log"))
        raw = RawPiper(settings)
        stack.callback(raw.close)
        voxmux = VoxMuxClient(vox.url)
        peer_client = PeerClient(peer_server.url, raw.engine.sample_rate)
        mp3 = VoxMuxClient(vox.url, name="voxmux_mp3", fmt="mp3")
        clients: list[VoxMuxClient | PeerClient] = [voxmux, peer_client]
        if single is not None:
            clients.append(VoxMuxClient(single.url, name="voxmux_c1"))
        for client in (*clients, mp3):
            stack.callback(client.close)
        latency_systems: list[System] = [raw, voxmux, mp3, peer_client]

        latency = {}
        for label, sentences in load.LENGTHS.items():
            print(f"latency {label} ({sentences} sentences, {plan.rounds[label]} rounds)",
                  flush=True)
            latency[label] = load.latency(latency_systems, sentences, plan.rounds[label])
            for name, row in latency[label].items():
                print(f"  {name:>10}: total {row['total_ms']} ttfa p50 "
                      f"{row['ttfa_ms']['p50']}", flush=True)

        print(f"throughput ({plan.throughput_sentences} sentences per request)", flush=True)
        variants = min(load.VARIANTS, max(plan.min_requests, plan.per_worker * max(plan.levels)))
        reference = load.reference_lengths(raw, plan.throughput_sentences, variants, repeats=1)
        throughput_systems: list[System] = [raw, *clients]
        throughput = load.throughput_levels(
            throughput_systems, plan.levels, plan.throughput_sentences, plan.per_worker,
            plan.min_requests, plan.throughput_requests, reference,
        )
        rss = {"voxmux_piper_loaded_mb": round(vox.rss() / MB, 1),
               "peer_loaded_mb": round(peer_server.rss() / MB, 1)}
    return {
        "voxmux_env": COMPARE_ENV,
        "peer": {"package": peer.REQUIREMENTS[0], "voice": peer.voice_path().name,
                 "route": "POST /synthesize"},
        "raw": "PiperEngine.synthesize in-process, one call per VoxMux segment (same splitter)",
        "latency": latency,
        "throughput": {"sentences": plan.throughput_sentences,
                       "audio_seconds": "raw engine's audio length of each text",
                       "systems": throughput},
        "rss": rss,
    }


def cache(plan: Plan) -> dict[str, Any]:
    env = {"VOXMUX_PRELOAD": "piper", **CACHE_ON}
    with voxmux_process(env) as server, httpx.Client(base_url=server.url, timeout=600) as client:
        rows = cache_rows(client, ("piper",), plan.cache_lengths, plan.cache_rounds)
    return {"rounds": plan.cache_rounds, "statistic": "median", "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a few requests per figure, into bench/results/quick/")
    parser.add_argument("--skip", action="append", default=[], choices=PHASES,
                        help="leave a phase out; its figures from the last run.json are kept")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    folder = RESULTS / "quick" if args.quick else RESULTS
    logs = ROOT / "var" / "bench"
    previous = _previous(folder / "run.json", args.quick)
    runs: dict[str, dict[str, Any]] = previous.get("phases", {})
    result: dict[str, Any] = {"quick": args.quick, "plan": asdict(plan), "phases": runs}
    for name in args.skip:
        if name in previous:
            result[name] = previous[name]
    if "compare" not in args.skip:
        with phase("compare", runs):
            result["compare"] = compare(plan, logs)
    if "cache" not in args.skip:
        with phase("cache", runs):
            result["cache"] = cache(plan)
    if "memory" not in args.skip:
        with phase("memory", runs):
            result["memory"] = memory.memory_run(
                plan.memory_models, plan.soak_models, plan.soak_requests, plan.soak_warmup,
                plan.soak_sample_every,
            )
    for name in list(runs):
        if name not in result:
            del runs[name]
    path = write_result("run", result, folder)
    from bench import report  # matplotlib is imported only once there is something to plot

    report.write(path, folder)
    print("wrote", path, "and", folder / "summary.md")


if __name__ == "__main__":
    main()
