"""Time to first audio against whole-response time, per engine, for 1, 5 and 20 sentences.

Run: `.venv/bin/python -m bench.ttfa` (starts its own server; writes bench/results/ttfa.json).
Each repeat starts at another of the benchmark's sentences (all 46-55 characters, the cache is
off), so the first segment is what a real text's would be.
"""

from __future__ import annotations

import time

import httpx

from bench.common import voxmux_server, write_result
from bench.load import text

MODELS = ("kokoro", "piper", "espeak")
LENGTHS = (1, 5, 20)
REPEATS = 3


def measure(client: httpx.Client, model: str, text: str) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = 0.0
    size = 0
    with client.stream("POST", "/v1/audio/speech", json={
        "model": model, "input": text, "voice": "alloy", "response_format": "pcm"}) as response:
        response.raise_for_status()
        for chunk in response.iter_bytes():
            if not first and chunk:
                first = time.perf_counter() - started
            size += len(chunk)
    return first, time.perf_counter() - started, size


def main() -> None:
    rows = []
    with voxmux_server({"VOXMUX_PRELOAD": ",".join(MODELS), "VOXMUX_CACHE_MAX_ITEMS": "0"}
                       ) as url, httpx.Client(base_url=url, timeout=600) as client:
        for model in MODELS:
            measure(client, model, "Warm up.")
            for n in LENGTHS:
                runs = [measure(client, model, text(n, i)) for i in range(REPEATS)]
                ttfa = sorted(r[0] for r in runs)[REPEATS // 2]
                total = sorted(r[1] for r in runs)[REPEATS // 2]
                rows.append({"model": model, "sentences": n, "ttfa_s": round(ttfa, 3),
                             "total_s": round(total, 3), "ttfa_share": round(ttfa / total, 3)})
                print(rows[-1], flush=True)
    path = write_result("ttfa", {"repeats": REPEATS, "statistic": "median", "rows": rows})
    print("wrote", path)


if __name__ == "__main__":
    main()
