"""hibari through VoxMux against hibari in-process: throughput at 1 and 4 requests at once, and
first audio.

    .venv/bin/python -m bench.hibari            # writes bench/results/hibari.json and hibari.md
    .venv/bin/python -m bench.hibari --quick    # a smoke test; numbers not meant

Systems:
- `voxmux`: `voxmux serve` on the cpu profile's defaults (only the audio cache off, so every
  request is synthesized, and the model kept loaded), `POST /v1/audio/speech` as pcm (OpenAI's
  24 kHz, hibari's own rate), read as a stream;
- `package`: the `hibari-tts` package in this process as its README shows it, one `Hibari()`
  shared by the calling threads, `Hibari.stream(text)`: its first audio is its first sentence.
Texts are five sentences of the benchmark's corpus (`bench.load.text`); audio is credited by the
package's length for each text, so both are credited the same for the same work. Throughput
rounds alternate between the systems (`bench.load.throughput_levels`).
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from typing import Any

from bench import load
from bench.common import run_benchmark, timed_phase, voxmux_process
from bench.systems import Sample, System, VoxMuxClient

VOXMUX_ENV = {"VOXMUX_PRELOAD": "hibari", "VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_IDLE_TTL": "-1",
              "VOXMUX_QUEUE_SIZE": "64"}
LEVELS = (1, 4)
SENTENCES = 5


class Package:
    """`hibari.Hibari` in this process, shared by every calling thread."""

    name = "package"

    def __init__(self) -> None:
        from hibari import Hibari

        self.tts = Hibari()
        self.tts("Warm up.")

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        first = 0.0
        samples = 0
        for chunk in self.tts.stream(text):
            first = first or time.perf_counter() - started
            samples += len(chunk)
        return Sample(first, time.perf_counter() - started, samples / self.tts.sample_rate)

    def close(self) -> None:
        pass


def measure(quick: bool) -> dict[str, Any]:
    phases: dict[str, Any] = {}
    result: dict[str, Any] = {"quick": quick, "voxmux_env": VOXMUX_ENV, "phases": phases,
                              "sentences": SENTENCES}
    with ExitStack() as stack:
        package = Package()
        vox = stack.enter_context(voxmux_process(VOXMUX_ENV))
        client = VoxMuxClient(vox.url, model="hibari")
        stack.callback(client.close)
        systems: list[System] = [client, package]
        for system in systems:  # warm up: first-run costs (both engine threads) in no figure
            for k in range(4):
                system.request(load.text(SENTENCES, k))
        with timed_phase("reference", phases):
            reference = load.reference_lengths(package, SENTENCES, load.VARIANTS, 1)
        with timed_phase("throughput", phases):
            result["throughput"] = load.throughput_levels(
                systems, LEVELS, SENTENCES, per_worker=4 if quick else 10,
                minimum=8 if quick else 20, per_level=16 if quick else 120,
                reference=reference)
        with timed_phase("first_audio", phases):
            result["first_audio"] = load.simultaneous(systems, LEVELS, SENTENCES,
                                                      2 if quick else 7)
    result["ratios"] = {
        str(level): round(result["throughput"]["voxmux"][level]["audio_s_per_s"]
                          / result["throughput"]["package"][level]["audio_s_per_s"], 3)
        for level in LEVELS}
    return result


def summary(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = ["# hibari: VoxMux against the package in-process", "",
             f"{machine['cpus']} CPUs ({machine['cpu_model']}), Python {machine['python']}, "
             f"{machine['date']}; {result['sentences']} sentences per request; other work on "
             "the machine per phase: " + ", ".join(
                 f"{name} {phase['other_work']['others']:.1%} (steal "
                 f"{phase['other_work']['steal']:.1%})"
                 for name, phase in result["phases"].items()), "",
             "| requests at once | VoxMux audio s/s | package audio s/s | VoxMux / package | "
             "CPU s per audio s: VoxMux / package | first audio, median: VoxMux / package | "
             "first audio, last: VoxMux / package |",
             "|---|---|---|---|---|---|---|"]
    for level in LEVELS:
        vox = result["throughput"]["voxmux"][str(level)]
        raw = result["throughput"]["package"][str(level)]
        first_vox = result["first_audio"]["voxmux"][str(level)]
        first_raw = result["first_audio"]["package"][str(level)]
        lines.append(
            f"| {level} | {vox['audio_s_per_s']:.1f} | {raw['audio_s_per_s']:.1f} | "
            f"{result['ratios'][str(level)]:.3f} | "
            f"{vox['cpu_s_per_audio_s']:.4f} / {raw['cpu_s_per_audio_s']:.4f} | "
            f"{first_vox['ttfa_median_s'] * 1000:.0f} / {first_raw['ttfa_median_s'] * 1000:.0f}"
            f" ms | {first_vox['ttfa_last_s'] * 1000:.0f} / "
            f"{first_raw['ttfa_last_s'] * 1000:.0f} ms |")
    rounds = {str(level): [round(x, 1) for x in result["throughput"]["voxmux"][str(level)]
                           ["rounds"]] for level in LEVELS}
    lines += ["", f"VoxMux's rounds (audio s/s): {rounds}; median of the package's at 1: "
              f"{statistics.median(result['throughput']['package']['1']['rounds']):.1f}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    run_benchmark("hibari", __doc__.splitlines()[0], measure, summary)
