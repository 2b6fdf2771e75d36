"""Latency and throughput loops over any `System`s, interleaved so machine noise hits all alike.

Latency: for each text length, round after round, every system gets the same text once, in an
order that rotates each round, so a burst of other work on the machine lands on all of them.
Throughput: `n` worker threads drain one shared list of requests; the figure is audio seconds per
wall second. Audio seconds are counted with the raw engine's audio length for each text (its
`reference`), so every system is credited the same for the same work and the ratios compare
work done per second; the audio each system actually delivered is recorded beside it. CPU
seconds per audio second count this process and every process under it (the raw engine or the
client, and the servers): time the hypervisor gives to other machines stretches the wall clock
but not this, so it shows what each system costs even on a noisy host.
Simultaneous: `count` requests sent at once, the first audio of each. Long text: one long text
per system and round, each round's time against a reference system's in the same round.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

from bench.common import SENTENCES, percentiles, sentences, tree_cpu_seconds
from bench.systems import Sample, System

LENGTHS = {"short": 1, "medium": 5, "long": 20}
"""Sentences per text; every sentence is 46-55 characters."""
VARIANTS = len(SENTENCES)
"""Distinct texts of each length (`text(n, k)` repeats after that)."""


def text(sentences: int, variant: int) -> str:
    """`sentences` sentences starting at a different one per `variant` (same length class)."""
    return " ".join(SENTENCES[(variant + k) % len(SENTENCES)] for k in range(sentences))


def rotated(systems: Sequence[System], shift: int) -> list[System]:
    shift %= len(systems)
    return [*systems[shift:], *systems[:shift]]


def latency(systems: Sequence[System], sentences: int, rounds: int) -> dict[str, Any]:
    """Per system: p50/p95/p99 of the whole response and of the first audio, in ms."""
    for system in systems:  # warm up: first-run costs belong to no figure
        system.request(text(1, 0))
    samples: dict[str, list[Sample]] = {s.name: [] for s in systems}
    for i in range(rounds):
        for system in rotated(systems, i):
            samples[system.name].append(system.request(text(sentences, i)))
    return {name: _summary(runs) for name, runs in samples.items()}


def _ms(values: list[float]) -> dict[str, float]:
    return {k: round(v * 1000, 1) if k != "n" else v for k, v in percentiles(values).items()}


def _summary(runs: list[Sample]) -> dict[str, Any]:
    return {
        "total_ms": _ms([r.total for r in runs]),
        "ttfa_ms": _ms([r.ttfa for r in runs]),
        "audio_s": round(statistics.fmean(r.audio_s for r in runs), 2),
    }


def throughput(system: System, workers: int, texts: Sequence[str],
               reference: dict[str, float]) -> dict[str, Any]:
    """Drain `texts` with `workers` threads; audio-seconds per wall-second, by reference length."""
    todo: queue.SimpleQueue[str] = queue.SimpleQueue()
    for item in texts:
        todo.put(item)
    delivered: list[float] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def work() -> None:
        while True:
            try:
                item = todo.get_nowait()
            except queue.Empty:
                return
            try:
                sample = system.request(item)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return
            with lock:
                delivered.append(sample.audio_s)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    cpu = tree_cpu_seconds(os.getpid())
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    cpu = tree_cpu_seconds(os.getpid()) - cpu
    if errors:
        raise RuntimeError(f"{system.name} failed at concurrency {workers}") from errors[0]
    audio = sum(reference[t] for t in texts)
    return {
        "requests": len(texts),
        "wall_s": wall,
        "audio_s_per_s": audio / wall,
        "delivered_audio_s_per_s": sum(delivered) / wall,
        "cpu_s_per_audio_s": cpu / audio,
    }


def throughput_levels(systems: Sequence[System], levels: Sequence[int], sentences: int,
                      per_worker: int, minimum: int, per_level: int,
                      reference: dict[str, float]) -> dict[str, dict[int, dict[str, Any]]]:
    """Every system at every concurrency. A round is `per_worker` requests per worker (at least
    `minimum`); each level runs as many rounds as make `per_level` requests per system, so the
    short rounds of low concurrency alternate often and host noise evens out there too. The
    systems take turns in a rotating order; the rounds are pooled (total audio over total wall
    time)."""
    out: dict[str, dict[int, dict[str, Any]]] = {s.name: {} for s in systems}
    turn = 0
    for workers in levels:
        count = max(minimum, per_worker * workers)
        texts = [text(sentences, k) for k in range(count)]
        runs: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
        for _ in range(max(1, per_level // count)):
            for system in rotated(systems, turn):
                runs[system.name].append(throughput(system, workers, texts, reference))
            turn += 1
        for name, parts in runs.items():
            wall = sum(p["wall_s"] for p in parts)
            audio = sum(p["audio_s_per_s"] * p["wall_s"] for p in parts)
            delivered = sum(p["delivered_audio_s_per_s"] * p["wall_s"] for p in parts)
            cpu = sum(p["cpu_s_per_audio_s"] * p["audio_s_per_s"] * p["wall_s"] for p in parts)
            out[name][workers] = {
                "requests": sum(p["requests"] for p in parts),
                "wall_s": round(wall, 3),
                "audio_s_per_s": round(audio / wall, 2),
                "delivered_audio_s_per_s": round(delivered / wall, 2),
                "cpu_s_per_audio_s": round(cpu / audio, 4),
                "rounds": [p["audio_s_per_s"] for p in parts],
            }
            print(f"  {name:>10} x{workers}: {out[name][workers]}", flush=True)
    return out


def reference_lengths(raw: System, sentences: int, variants: int, repeats: int
                      ) -> dict[str, float]:
    """The raw engine's mean audio length per text (Piper's durations vary a little per run)."""
    lengths: dict[str, float] = {}
    for k in range(variants):
        item = text(sentences, k)
        lengths[item] = statistics.fmean(raw.request(item).audio_s for _ in range(repeats))
    return lengths


def simultaneous(systems: Sequence[System], counts: Sequence[int], n_sentences: int,
                 rounds: int) -> dict[str, dict[int, dict[str, float]]]:
    """`count` requests sent at once: first audio of each, the last one's and the median."""
    out: dict[str, dict[int, dict[str, float]]] = {s.name: {} for s in systems}
    for count in counts:
        texts = [text(n_sentences, k) for k in range(count)]
        firsts: dict[str, list[float]] = {s.name: [] for s in systems}
        lasts: dict[str, list[float]] = {s.name: [] for s in systems}
        totals: dict[str, list[float]] = {s.name: [] for s in systems}
        for r in range(rounds):
            for system in rotated(systems, r):
                with concurrent.futures.ThreadPoolExecutor(count) as pool:
                    samples = list(pool.map(system.request, texts))
                ttfa = sorted(s.ttfa for s in samples)
                firsts[system.name].append(statistics.median(ttfa))
                lasts[system.name].append(ttfa[-1])
                totals[system.name].append(max(s.total for s in samples))
        for system in systems:
            out[system.name][count] = {
                "ttfa_median_s": round(statistics.median(firsts[system.name]), 3),
                "ttfa_last_s": round(statistics.median(lasts[system.name]), 3),
                "all_done_s": round(statistics.median(totals[system.name]), 3),
            }
            print(f"  {system.name:>12} x{count}: {out[system.name][count]}", flush=True)
    return out


def long_text(systems: Sequence[System], n_sentences: int, rounds: int, *, reference: str
              ) -> dict[str, Any]:
    """One text of `n_sentences`, whole time per system, and each round's ratio to `reference`
    in the same round: the machine's speed drifts by 5-15 % within an hour, so a ratio of
    medians would carry that drift."""
    whole = sentences(n_sentences)
    runs: dict[str, list[Sample]] = {s.name: [] for s in systems}
    for r in range(rounds):
        for system in rotated(systems, r):
            runs[system.name].append(system.request(whole))
    against = runs[reference]
    out = {name: {"total_s": round(statistics.median(s.total for s in samples), 3),
                  "ttfa_s": round(statistics.median(s.ttfa for s in samples), 3),
                  "audio_s": round(statistics.median(s.audio_s for s in samples), 2),
                  "per_round_ratio": [round(s.total / r.total, 3)
                                      for s, r in zip(samples, against, strict=True)]}
           for name, samples in runs.items()}
    for name, row in out.items():
        print(f"  {name:>12}: {row}", flush=True)
    return {"sentences": n_sentences, "chars": len(whole), "rounds": rounds,
            "reference": reference, "systems": out}


def long_text_table(long: dict[str, Any], title: str, peer: str) -> list[str]:
    """The Markdown lines of a `long_text` result: whole time, first audio and the ratio to the
    reference, the median and each round's (a result from before per-round ratios were kept
    gets its one ratio of totals)."""
    rows = long["systems"]
    reference = rows[long.get("reference", "kokoro_onnx")]
    lines = ["", f"## {title} ({long['sentences']} sentences, {long['chars']} characters)", "",
             f"{long['rounds']} rounds, median; the ratio is each round's against {peer} in the "
             "same round.", "",
             f"| system | whole time (s) | first audio (s) | / {peer}, median "
             f"| / {peer}, each round |", "|---|---|---|---|---|"]
    for name, row in rows.items():
        each = row.get("per_round_ratio") or [row["total_s"] / reference["total_s"]]
        lines.append(f"| {name} | {row['total_s']:.2f} | {row['ttfa_s']:.2f} "
                     f"| {statistics.median(each):.2f} "
                     f"| {' '.join(f'{r:.2f}' for r in each)} |")
    return lines
