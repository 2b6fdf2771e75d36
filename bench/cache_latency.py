"""Audio-cache hit latency against a miss for the same request, per engine and text length.

Each round sends a fresh text (a miss: synthesized) and then the same request again (a hit:
replayed from the cache and encoded), and records time to first byte and to the last byte.
Run: `.venv/bin/python -m bench.cache_latency` (starts its own server; writes
bench/results/cache.json). `--quick` does one engine, one length, two rounds: a smoke test.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
import uuid

import httpx

from bench.common import sentences, voxmux_server, write_result

MODELS = ("kokoro", "piper", "espeak")
LENGTHS = (1, 5, 20)
ROUNDS = 3
FORMATS = ("pcm", "mp3")
"""pcm shows the cache alone; mp3 (OpenAI's default) adds the encoding every hit still pays."""


def measure(client: httpx.Client, model: str, text: str, fmt: str = "pcm"
            ) -> tuple[str, float, float]:
    started = time.perf_counter()
    first = 0.0
    with client.stream("POST", "/v1/audio/speech", json={
        "model": model, "input": text, "voice": "alloy", "response_format": fmt,
    }) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if not first and chunk:
                first = time.perf_counter() - started
    return response.headers["x-voxmux-cache"], first, time.perf_counter() - started


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


def cache_rows(client: httpx.Client, models: tuple[str, ...], lengths: tuple[int, ...],
               rounds: int) -> list[dict[str, object]]:
    """Miss against hit medians per model, length and format, from a server with the cache on."""
    rows: list[dict[str, object]] = []
    for model in models:
        measure(client, model, f"Warm up {uuid.uuid4().hex[:6]}.")
        for n, fmt in itertools.product(lengths, FORMATS):
            miss: list[tuple[float, float]] = []
            hit: list[tuple[float, float]] = []
            for i in range(rounds):
                text = f"Round {i} {uuid.uuid4().hex[:6]}. " + sentences(n)
                state, *times = measure(client, model, text, fmt)
                assert state == "miss", state
                miss.append((times[0], times[1]))
                state, *times = measure(client, model, text, fmt)
                assert state == "hit", state
                hit.append((times[0], times[1]))
            miss_total = median_ms([m[1] for m in miss])
            hit_total = median_ms([h[1] for h in hit])
            row = {
                "model": model, "sentences": n, "format": fmt,
                "miss_ttfb_ms": median_ms([m[0] for m in miss]), "miss_total_ms": miss_total,
                "hit_ttfb_ms": median_ms([h[0] for h in hit]), "hit_total_ms": hit_total,
                "speedup_total": round(miss_total / hit_total, 1),
            }
            rows.append(row)
            print(row, flush=True)
    return rows


CACHE_ON = {"VOXMUX_CACHE_MAX_ITEMS": "4096"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="espeak, 1 sentence, 2 rounds (checks the script, not the numbers)")
    args = parser.parse_args()
    models, lengths, rounds = (("espeak",), (1,), 2) if args.quick else (MODELS, LENGTHS, ROUNDS)
    env = {"VOXMUX_PRELOAD": ",".join(models), **CACHE_ON}
    with voxmux_server(env) as url, httpx.Client(base_url=url, timeout=600) as client:
        rows = cache_rows(client, models, lengths, rounds)
        stats = client.get("/stats").json()["cache"]
    path = write_result("cache", {
        "rounds": rounds, "statistic": "median", "quick": args.quick,
        "cache": stats, "rows": rows,
    })
    print("wrote", path)


if __name__ == "__main__":
    main()
