"""Kokoro at each graph precision under concurrent requests: the part of `bench/gpu_check.py`
that says whether the float graphs pay on a GPU.

Per precision (int8, fp32, fp16; `VOXMUX_KOKORO_PRECISION`): seconds to build the graph (0 once
cached) and to load it, the providers its session runs on, the time to the first chunk of
`stream` (the first audio a client could get), and for each concurrency level N: N threads each
synthesizing the same text `rounds` times on the one loaded engine, as N admitted requests share
a model's session in the server. Reported per level: wall seconds, audio seconds, RTF (wall /
audio: the whole batch's throughput) and the mean and worst single-request RTF. VRAM: peak of
this process and growth of the whole device while the precision was measured.

`instances_sweep`: a model with 1, 2, 4 sessions of its graph (`VOXMUX_INSTANCES`) under 1 to 32
concurrent requests, each a short first segment then a longer one as the server cuts a text;
per cell the aggregate audio seconds per wall second and the p50 and p95 of first audio.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.serving.wiring import runtime_options
from app.settings import Settings
from engines.base import SynthesisRequest
from engines.kokoro import KokoroEngine, prepare_model
from engines.kokoro_float import Precision

TEXT = ("The morning train left the station exactly on time. Passengers read their papers in "
        "comfortable silence while the fields went by.")
VOICE = "jf_alpha"


@dataclass
class Level:
    concurrency: int
    requests: int
    wall_s: float
    audio_s: float
    rtf: float
    """wall / total audio: below 1/N means N streams keep up in real time."""
    request_rtf_mean: float
    request_rtf_max: float


@dataclass
class PrecisionResult:
    precision: str
    providers: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    build_s: float | None = None
    load_s: float | None = None
    first_audio_s: float | None = None
    """Best of three: request in, first chunk of `stream` out, on an idle engine."""
    levels: list[Level] = field(default_factory=list)
    vram_process_mib: float | None = None
    vram_device_delta_mib: float | None = None
    error: str | None = None



def _in_threads(worker: Callable[[], None], concurrency: int, errors: list[BaseException]
                ) -> float:
    """Wall seconds of `concurrency` threads each running `worker`; the first error a worker
    recorded in `errors` is raised here."""
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start

def _first_audio(engine: KokoroEngine, request: SynthesisRequest, tries: int) -> float:
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        next(iter(engine.stream(request)))
        best = min(best, time.perf_counter() - start)
    return best


def _level(engine: KokoroEngine, request: SynthesisRequest, concurrency: int, rounds: int
           ) -> Level:
    barrier = threading.Barrier(concurrency)
    timings: list[tuple[float, float]] = []  # (seconds, audio seconds) per request
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            for _ in range(rounds):
                start = time.perf_counter()
                audio = engine.synthesize(request)
                took = time.perf_counter() - start
                with lock:
                    timings.append((took, len(audio) / engine.sample_rate))
        except BaseException as exc:  # reported by the caller, not lost in a thread
            errors.append(exc)

    wall = _in_threads(worker, concurrency, errors)
    audio_s = sum(a for _, a in timings)
    per_request = [t / a for t, a in timings]
    return Level(concurrency, len(timings), round(wall, 3), round(audio_s, 3),
                 round(wall / audio_s, 4), round(statistics.fmean(per_request), 4),
                 round(max(per_request), 4))


def measure(settings: Settings, precision: Precision, levels: list[int], rounds: int,
            text: str = TEXT, first_audio_tries: int = 3) -> PrecisionResult:
    """One precision; raises what building or loading it raised. The time to first audio is the
    best of `first_audio_tries` runs."""
    result = PrecisionResult(precision)
    runtime = runtime_options(settings)
    request = SynthesisRequest(text=text, voice=VOICE)
    start = time.perf_counter()
    prepare_model(settings.cache_dir, precision)
    result.build_s = round(time.perf_counter() - start, 3)
    engine = KokoroEngine(settings.cache_dir, settings.models_dir / "kokoro", runtime, precision)
    start = time.perf_counter()
    engine.load()
    result.load_s = round(time.perf_counter() - start, 3)
    try:
        engine.synthesize(request)  # the first run plans kernels (cuDNN searches its algorithms)
        result.first_audio_s = round(_first_audio(engine, request, first_audio_tries), 4)
        result.levels = [_level(engine, request, n, rounds) for n in levels]
    finally:
        engine.unload()
    result.providers = list(runtime.in_use)
    result.fallbacks = list(runtime.fallbacks)
    return result


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def render(results: list[PrecisionResult]) -> str:
    levels = sorted({level.concurrency for r in results for level in r.levels})
    head = (f"{'kokoro':<7} {'providers':<22} {'build s':>8} {'load s':>7} {'first s':>8} "
            + " ".join(f"{f'RTF@{n}':>8}" for n in levels)
            + f" {'VRAM pid MiB':>13} {'VRAM dev MiB':>13}")
    lines = [head]
    for r in results:
        by_level = {level.concurrency: level.rtf for level in r.levels}
        providers = ",".join(p.removesuffix("ExecutionProvider") for p in r.providers) or "-"
        lines.append(
            f"{r.precision:<7} {providers:<22} {_cell(r.build_s):>8} {_cell(r.load_s):>7} "
            f"{_cell(r.first_audio_s):>8} "
            + " ".join(f"{_cell(by_level.get(n)):>8}" for n in levels)
            + f" {_cell(r.vram_process_mib):>13} {_cell(r.vram_device_delta_mib):>13}")
    lines.append("RTF@N: wall seconds / audio seconds of N concurrent requests (1/N keeps up).")
    for r in results:
        lines += [f"FALLBACK kokoro {r.precision}: {note}" for note in r.fallbacks]
        if r.error:
            lines.append(f"ERROR kokoro {r.precision}: {r.error}")
    return "\n".join(lines)


def markdown(results: list[PrecisionResult]) -> str:
    """The same numbers as a Markdown table (for the committed results)."""
    levels = sorted({level.concurrency for r in results for level in r.levels})
    lines = ["| precision | providers | build s | load s | first audio s | "
             + " | ".join(f"RTF @{n}" for n in levels) + " | VRAM pid MiB | VRAM device MiB |",
             "|---" * (6 + len(levels)) + "|---|"]
    for r in results:
        by_level = {level.concurrency: level.rtf for level in r.levels}
        lines.append(
            f"| {r.precision} | {', '.join(r.providers) or '-'} | {_cell(r.build_s)} | "
            f"{_cell(r.load_s)} | {_cell(r.first_audio_s)} | "
            + " | ".join(_cell(by_level.get(n)) for n in levels)
            + f" | {_cell(r.vram_process_mib)} | {_cell(r.vram_device_delta_mib)} |")
    return "\n".join(lines)


PIPER_TEXT = "The morning train left the station exactly on time."


@dataclass
class BatchResult:
    batch: int
    """`VOXMUX_ENGINE_BATCH`: 1 is batching off."""
    providers: list[str] = field(default_factory=list)
    levels: list[Level] = field(default_factory=list)
    mean_run: float | None = None
    """Segments per inference on average over the levels (1.0: none met)."""
    error: str | None = None


def piper_batching(settings: Settings, batches: list[int], levels: list[int], rounds: int,
                   text: str = PIPER_TEXT) -> list[BatchResult]:
    """Piper's embedded voice at each batch size, N threads as N requests' segments: does
    padding several into one run (`engines.batching`) pay on this device?"""
    from engines.piper import PiperEngine

    results = []
    for batch in batches:
        result = BatchResult(batch)
        runtime = runtime_options(settings.model_copy(update={"engine_batch": batch}))
        engine = PiperEngine.from_settings(settings, runtime)
        request = SynthesisRequest(text=text, voice=engine.default_voice)
        try:
            engine.load()
            engine.synthesize(request)  # plan kernels before timing
            result.levels = [_level(engine, request, n, rounds) for n in levels]
            model = engine._resolve(engine.default_voice)[0]
            runs = model.batcher.runs if model.batcher is not None else []
            result.mean_run = round(statistics.fmean(runs), 2) if runs else 1.0
        except Exception as exc:  # a row, not the end of the check
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            engine.unload()
        result.providers = list(runtime.in_use)
        results.append(result)
    return results


def batch_markdown(results: list[BatchResult]) -> str:
    levels = sorted({level.concurrency for r in results for level in r.levels})
    lines = ["| Piper batch | providers | segments per run | "
             + " | ".join(f"RTF @{n}" for n in levels) + " |",
             "|---" * (3 + len(levels)) + "|"]
    for r in results:
        by_level = {level.concurrency: level.rtf for level in r.levels}
        lines.append(f"| {r.batch} | {', '.join(r.providers) or '-'} | {_cell(r.mean_run)} | "
                     + " | ".join(_cell(by_level.get(n)) for n in levels) + " |")
    lines += [f"ERROR piper batch {r.batch}: {r.error}" for r in results if r.error]
    return "\n".join(lines)


FIRST_SEGMENT = "The morning train left on time."
REST_SEGMENT = "Passengers read their papers in silence while the green fields went by."
"""A request as the server hands it to an engine: a short first segment (early audio), then a
longer one. First audio is when the first segment's audio is out."""


@dataclass
class Cell:
    """One measured cell of the instances sweep: `concurrency` requests at once on a model with
    `instances` sessions, on `provider`. The fields every reader of `gpu.json` may rely on:
    model, instances, concurrency, x_realtime, first_audio_s, first_audio_p95_s."""

    model: str
    instances: int
    concurrency: int
    x_realtime: float
    """Aggregate throughput: audio seconds of every request over the wall seconds of the cell."""
    first_audio_s: float
    """p50 over the requests: request start to its first segment's audio."""
    first_audio_p95_s: float
    provider: str
    """The provider asked for (`providers` says what the sessions really ran on)."""
    providers: list[str] = field(default_factory=list)
    requests: int = 0
    wall_s: float = 0.0
    audio_s: float = 0.0
    vram_per_instance_mib: float | None = None
    """What each session took on the card as it opened (`/health`'s figure); None on CPU."""
    vram_process_mib: float | None = None
    """Peak VRAM of this process while the instances setting ran (set by `bench/gpu_check.py`
    through NVML; None without it)."""


@dataclass
class SweepTarget:
    model: str
    """Catalogue id."""
    provider: str
    """`CUDAExecutionProvider` (with the CPU for what CUDA lacks) or `CPUExecutionProvider`."""


def _percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (the p95 of four values is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def _cell_run(engine: Any, voice: str, concurrency: int, requests: int, segments: list[str]
              ) -> tuple[float, float, list[float]]:
    """`requests` requests, `concurrency` at a time, each its segments in order:
    (wall seconds, audio seconds, first-audio seconds per request)."""
    import queue

    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    for n in range(requests):
        todo.put(n)
    firsts: list[float] = []
    audio = [0.0]
    lock = threading.Lock()
    errors: list[BaseException] = []
    barrier = threading.Barrier(concurrency)

    def worker() -> None:
        try:
            barrier.wait()
            while True:
                try:
                    todo.get_nowait()
                except queue.Empty:
                    return
                start = time.perf_counter()
                first: float | None = None
                samples = 0
                for text in segments:
                    for chunk in engine.stream(SynthesisRequest(text=text, voice=voice)):
                        samples += len(chunk)
                    if first is None:
                        first = time.perf_counter() - start
                with lock:
                    firsts.append(first or 0.0)
                    audio[0] += samples / engine.sample_rate
        except BaseException as exc:  # reported by the caller, not lost in a thread
            errors.append(exc)

    wall = _in_threads(worker, concurrency, errors)
    return wall, audio[0], firsts


def instances_sweep(settings: Settings, targets: list[SweepTarget], instances: list[int],
                    levels: list[int], requests: int = 0, deadline: float | None = None,
                    segments: list[str] | None = None,
                    vram: Callable[[], Any] | None = None) -> tuple[list[Cell], list[str]]:
    """Every target model at every instance count and concurrency level: the cells measured,
    and a note for each one left out (an error, or `deadline`, a `time.monotonic()` value, come).

    `requests`: per cell, 0 for one per concurrent request and at least 4 (each thread makes
    one request, so every request is measured under the cell's concurrency; a p95 of four
    requests at concurrency 1 is their slowest). `vram`: a context manager factory whose
    object has `peak_process` (bytes) after the block (`gpu_check.VramSampler`)."""
    from app.serving.catalogue import Catalogue
    from engines.plugin import build_engine

    segments = segments or [FIRST_SEGMENT, REST_SEGMENT]
    catalogue = Catalogue.load(settings.catalogue_path)
    cells: list[Cell] = []
    notes: list[str] = []
    for target in targets:
        entry = catalogue.models[target.model]
        providers = ([target.provider] if target.provider == "CPUExecutionProvider"
                     else [target.provider, "CPUExecutionProvider"])
        for count in instances:
            if deadline is not None and time.monotonic() > deadline:
                notes.append(f"{target.model} {target.provider} x{count}: out of time")
                continue
            runtime = runtime_options(settings).for_model(providers, count)
            engine = build_engine(entry.engine, settings, runtime)
            sampler = vram() if vram is not None else contextlib.nullcontext()
            measured: list[Cell] = []
            try:
                with sampler:
                    engine.load()
                    try:
                        engine.synthesize(SynthesisRequest(text=segments[0],
                                                           voice=entry.default_voice))
                        report = engine.instances() if hasattr(engine, "instances") else None
                        for level in levels:
                            if deadline is not None and time.monotonic() > deadline:
                                notes.append(f"{target.model} {target.provider} x{count} "
                                             f"@{level}: out of time")
                                continue
                            n = requests or max(level, 4)
                            wall, audio_s, firsts = _cell_run(engine, entry.default_voice,
                                                              level, n, segments)
                            measured.append(Cell(
                                target.model, count, level, round(audio_s / wall, 2),
                                round(_percentile(firsts, 50), 4),
                                round(_percentile(firsts, 95), 4), target.provider,
                                list(runtime.in_use), n, round(wall, 3), round(audio_s, 3),
                                report.vram_mib if report is not None else None))
                    finally:
                        engine.unload()
            except Exception as exc:  # a note, not the end of the sweep
                notes.append(f"{target.model} {target.provider} x{count}: "
                             f"{type(exc).__name__}: {exc}")
            peak = getattr(sampler, "peak_process", None)
            for cell in measured:
                cell.vram_process_mib = round(peak / 2**20, 1) if peak else None
            cells += measured
    return cells, notes


def cells_markdown(cells: list[Cell]) -> str:
    """One row per model, provider and instance count; a column pair per concurrency level."""
    levels = sorted({c.concurrency for c in cells})
    lines = ["| model | provider | instances | VRAM per instance MiB | "
             + " | ".join(f"x RT @{n} | first p50/p95 s @{n}" for n in levels) + " |",
             "|---|---|---|---|" + "---|---|" * len(levels)]
    rows: dict[tuple[str, str, int], dict[int, Cell]] = {}
    for cell in cells:
        rows.setdefault((cell.model, cell.provider, cell.instances), {})[cell.concurrency] = cell
    for (model, provider, count), by_level in rows.items():
        vram = next((c.vram_per_instance_mib for c in by_level.values()), None)
        parts = []
        for n in levels:
            cell = by_level.get(n)
            parts += ([str(cell.x_realtime), f"{cell.first_audio_s}/{cell.first_audio_p95_s}"]
                      if cell else ["-", "-"])
        lines.append(f"| {model} | {provider.removesuffix('ExecutionProvider')} | {count} | "
                     f"{_cell(vram)} | " + " | ".join(parts) + " |")
    return "\n".join(lines)
