"""In-process GPU check: every engine on the profile's providers, with RTF and VRAM, and Kokoro at
each graph precision under concurrent requests.

    python bench/gpu_check.py [--profile gpu] [--providers LIST] [--models kokoro,piper,espeak]
                              [--runs N] [--json] [--out DIR] [--allow-fallback]
                              [--precisions int8,fp32,fp16|none] [--concurrency 1,4,8,16]
                              [--rounds N] [--text-lang auto|ja|en] [--piper-batch 1,8|none]
                              [--instances 1,2,4|none] [--sweep-concurrency 1,4,8,16,32]
                              [--sweep-targets kokoro@CUDA,piper@CPU,piper@CUDA]
                              [--sweep-requests N] [--sweep-budget S]

Per model: load seconds, the providers its sessions really run on, the first (cold) synthesis,
the RTF of the best of a few warm ones, and VRAM through NVML (this process and the whole device,
peak while it ran). Any fallback from CUDA to CPU is printed with its reason. Then, when Kokoro is
among the models, `bench/gpu_sweep.py` measures each precision: build and load seconds, first
audio, RTF at each concurrency level, VRAM (`--precisions none` skips it). When Piper is among
them, `gpu_sweep.piper_batching` measures batching off and on (`VOXMUX_ENGINE_BATCH`, one value
per `--piper-batch` entry) at the same concurrency levels. Last, the instances sweep
(`gpu_sweep.instances_sweep`): each `--sweep-targets` model on its provider (Kokoro at the
profile's graph precision) with each `--instances` count of sessions (`VOXMUX_INSTANCES`) under
each `--sweep-concurrency` level of concurrent requests, each request a short first segment and a
longer one; it stops where `--sweep-budget` seconds run out and names the cells it left out.

Output (`--json` prints it, `--out DIR` writes it as `DIR/gpu_check.json`, with the tables as
`DIR/gpu_check.md`; commit them as `bench/results/gpu.json` and `gpu.md`):
    {"environment": {python, onnxruntime, package, available_providers, requested_providers,
                     profile, nvml},
     "results": [{model, engine, providers, fallbacks, load_s, cold_s, warm_s, audio_s, rtf,
                  vram_process_mib, vram_device_delta_mib, error}, ...],
     "kokoro_precisions": [{precision, providers, fallbacks, build_s, load_s, first_audio_s,
                            levels: [{concurrency, requests, wall_s, audio_s, rtf,
                                      request_rtf_mean, request_rtf_max}, ...],
                            vram_process_mib, vram_device_delta_mib, error}, ...],
     "piper_batching": [{batch, providers, levels: [...as above], mean_run, error}, ...],
     "cells": [{model, instances, concurrency, x_realtime, first_audio_s, first_audio_p95_s,
                provider, providers, requests, wall_s, audio_s, vram_per_instance_mib,
                vram_process_mib}, ...],
     "cells_left_out": [note, ...],
     "kokoro_batch": {providers, segments, audio_seconds, one_by_one_s, batched_s,
                      max_abs_diff: [...]} or {error} or null,
     "settings": {precisions, concurrency, rounds, piper_batch, instances, sweep_concurrency,
                  sweep_targets, sweep_requests}}
A cell: `x_realtime` is the aggregate audio seconds per wall second of its requests,
`first_audio_s` and `first_audio_p95_s` the p50 and p95 of request start to first audio.
Exit status: 0 all well, 1 an ONNX engine asked for CUDA but runs on CPU (0 with
--allow-fallback), 2 a model or a precision failed. `bench/gpu_check.sh` wraps it with an install
step and a time limit.

Kokoro reads Japanese, unless --text-lang en or (auto, the default) its Japanese and Chinese
readers are not installed (an offline GPU machine, see gpu_check.sh's WHEELHOUSE): then it reads
English through eSpeak NG, and the readers its load would start are replaced by stand-ins. The
precision sweep always reads English.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import soundfile  # noqa: E402

from app.cli.doctor import nvml_report  # noqa: E402
from app.serving.catalogue import Catalogue  # noqa: E402
from app.serving.memory import NVML  # noqa: E402
from app.serving.wiring import runtime_options  # noqa: E402
from app.settings import Settings, load_settings  # noqa: E402
from bench import gpu_sweep  # noqa: E402
from engines.base import SynthesisFailed, SynthesisRequest  # noqa: E402
from engines.kokoro_float import PRECISIONS, Precision  # noqa: E402
from engines.onnx import (  # noqa: E402
    CUDA,
    available_providers,
    runtime_package,
    runtime_version,
)
from engines.plugin import SHORT_NAMES, build_engine  # noqa: E402
from engines.registry import ModelEntry  # noqa: E402

TEXTS = {
    "kokoro": "今日はとても良い天気ですね。午後から公園へ散歩に行きましょう。",
    "default": "The morning train left the station exactly on time. Passengers read their papers "
               "in comfortable silence while the fields went by.",
}
CJK_READERS = ("pyopenjtalk", "jieba")
"""What Kokoro's load needs beyond the ONNX weights: the Japanese reader (pyopenjtalk-plus, in
its helper process) and jieba's dictionary; about 180 MB installed, none of it on the GPU."""
WARM_RUNS = 3
PROVIDER_NAMES = {"CUDA": CUDA, "CPU": "CPUExecutionProvider"}
SWEEP_MARGIN_S = 60
"""No sweep cell starts this close to `GPU_CHECK_END`: the results are written before the kill."""
SAMPLE_EVERY = 0.02


def missing_readers() -> list[str]:
    return [name for name in CJK_READERS if importlib.util.find_spec(name) is None]


def stand_in_readers() -> None:
    """Let Kokoro load without pyopenjtalk-plus and jieba, for English text only: its load starts
    the Japanese reader and warms jieba, which the text then never reaches. The stand-in reader
    refuses every call; the stand-in word cut keeps a run of Han characters whole."""
    from engines.frontend import ja, zh

    def refuse(op: str, text: str) -> Any:
        raise SynthesisFailed(f"the Japanese reader is not installed ({op} of {text[:20]!r})")

    ja.READER.hold = lambda *, start: None
    ja.READER.release = lambda: None
    ja.READER.call = refuse
    zh.words = lambda text: [text]
    zh.release = lambda: None


@dataclass
class Result:
    model: str
    engine: str
    providers: list[str] = field(default_factory=list)
    """What the model's ONNX sessions run on; empty for an engine without ONNX (eSpeak NG)."""
    fallbacks: list[str] = field(default_factory=list)
    load_s: float | None = None
    cold_s: float | None = None
    warm_s: float | None = None
    audio_s: float | None = None
    rtf: float | None = None
    vram_process_mib: float | None = None
    """Peak VRAM of this PID; None or 0 where NVML cannot attribute it (a container's PIDs)."""
    vram_device_delta_mib: float | None = None
    """Peak growth of memory used on every GPU while the model loaded and ran."""
    error: str | None = None

    @property
    def fell_back(self) -> bool:
        return bool(self.providers) and CUDA not in self.providers and any(
            CUDA in note for note in self.fallbacks)


class VramSampler:
    """Peak VRAM while a block runs: this process (NVML by PID) and every device's used memory."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._handles: list[Any] = []
        self._nvml: Any = None
        if NVML.available:
            import pynvml

            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.base_device = self._device()
        self.peak_device = self.base_device
        self.peak_process: int | None = NVML.used_by(self._pid)

    def _device(self) -> int | None:
        if not self._handles:
            return None
        return sum(int(self._nvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles)

    def _sample(self) -> None:
        device, process = self._device(), NVML.used_by(self._pid)
        if device is not None and self.peak_device is not None:
            self.peak_device = max(self.peak_device, device)
        if process is not None:
            self.peak_process = max(self.peak_process or 0, process)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self._sample()

    def __enter__(self) -> VramSampler:
        if self._handles:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        if self._handles:
            self._sample()


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 1)


def check_model(entry: ModelEntry, settings: Settings, out: Path | None,
                runs: int = WARM_RUNS, texts: dict[str, str] = TEXTS) -> Result:
    result = Result(model=entry.id, engine=entry.engine)
    runtime = runtime_options(settings).for_model(settings.providers_for(entry.id),
                                                  settings.instances_for(entry.id))
    request = SynthesisRequest(text=texts["default"], voice=entry.default_voice)
    try:
        engine = build_engine(entry.engine, settings, runtime)
        result.engine = engine.name
        request = SynthesisRequest(text=texts.get(engine.name, texts["default"]),
                                   voice=entry.default_voice)
        with VramSampler() as vram:
            start = time.perf_counter()
            engine.load()
            result.load_s = round(time.perf_counter() - start, 3)
            engine.validate(request)
            start = time.perf_counter()
            audio = engine.synthesize(request)
            result.cold_s = round(time.perf_counter() - start, 3)
            warm = []
            for _ in range(max(runs, 1)):
                start = time.perf_counter()
                audio = engine.synthesize(request)
                warm.append(time.perf_counter() - start)
        engine.unload()
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        result.fallbacks = list(runtime.fallbacks)
        return result
    result.providers = list(runtime.in_use)
    result.fallbacks = list(runtime.fallbacks)
    result.warm_s = round(min(warm), 3)
    result.audio_s = round(len(audio) / engine.sample_rate, 3)
    result.rtf = round(min(warm) / result.audio_s, 4) if result.audio_s else None
    result.vram_process_mib = _mib(vram.peak_process)
    if vram.base_device is not None and vram.peak_device is not None:
        result.vram_device_delta_mib = _mib(vram.peak_device - vram.base_device)
    if out is not None:
        soundfile.write(out / f"gpu_check_{entry.id}.wav", audio, engine.sample_rate)
    return result


def sweep(settings: Settings, precisions: list[Precision], levels: list[int], rounds: int
          ) -> list[gpu_sweep.PrecisionResult]:
    results = []
    for precision in precisions:
        try:
            with VramSampler() as vram:
                result = gpu_sweep.measure(settings, precision, levels, rounds)
        except Exception as exc:  # one precision failing (fp16 without its converter) is a row
            error = f"{type(exc).__name__}: {exc}"
            results.append(gpu_sweep.PrecisionResult(precision, error=error))
            continue
        result.vram_process_mib = _mib(vram.peak_process)
        if vram.base_device is not None and vram.peak_device is not None:
            result.vram_device_delta_mib = _mib(vram.peak_device - vram.base_device)
        results.append(result)
    return results


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _counts(low: int, high: int) -> Callable[[str], list[int]]:
    """An argument type: a comma list of whole numbers from `low` to `high`, or `none` ([])."""
    def parse(text: str) -> list[int]:
        if text.strip() == "none":
            return []
        try:
            counts = _ints(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of whole numbers, "
                                             "or none") from None
        if not counts or not all(low <= n <= high for n in counts):
            raise argparse.ArgumentTypeError(f"{text!r}: each from {low} to {high}")
        return counts
    return parse


def _targets(text: str) -> list[tuple[str, str]]:
    """--sweep-targets: (model, provider) for each `model@CUDA` or `model@CPU`."""
    targets = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        model, _, where = part.partition("@")
        if not model or where not in PROVIDER_NAMES:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not model@{' or model@'.join(PROVIDER_NAMES)}")
        targets.append((model, PROVIDER_NAMES[where]))
    return targets


def environment(settings: Settings) -> dict[str, Any]:
    import onnxruntime

    return {"python": platform.python_version(), "onnxruntime": runtime_version(),
            "package": runtime_package(), "available_providers": available_providers(),
            "onnxruntime_dir": str(Path(onnxruntime.__file__).parent),
            "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
            "requested_providers": list(settings.providers), "profile": settings.profile,
            "nvml": nvml_report()}


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def render(env: dict[str, Any], results: list[Result]) -> str:
    nvml = env["nvml"]
    gpus = ", ".join(f"{d['name']} ({d['memory_total_mib']} MiB)" for d in nvml["devices"])
    lines = [
        f"profile {env['profile']}, Python {env['python']}, {env['package']} "
        f"{env['onnxruntime']} ({env['onnxruntime_dir']}), Kokoro reads {env['kokoro_text']}",
        f"available providers: {', '.join(env['available_providers'])}",
        f"requested providers: {', '.join(env['requested_providers'])}",
        f"NVML: driver {nvml['driver']}, CUDA {nvml['cuda']}, {gpus}" if nvml["available"]
        else f"NVML: not available ({nvml['detail']})",
        "",
        f"{'model':<8} {'providers in use':<45} {'load s':>7} {'cold s':>7} {'warm s':>7} "
        f"{'audio s':>8} {'RTF':>7} {'VRAM pid MiB':>13} {'VRAM dev MiB':>13}",
    ]
    for r in results:
        providers = ", ".join(r.providers) or ("(error)" if r.error else "n/a (no ONNX)")
        lines.append(
            f"{r.model:<8} {providers:<45} {_cell(r.load_s):>7} {_cell(r.cold_s):>7} "
            f"{_cell(r.warm_s):>7} {_cell(r.audio_s):>8} {_cell(r.rtf):>7} "
            f"{_cell(r.vram_process_mib):>13} {_cell(r.vram_device_delta_mib):>13}")
    for r in results:
        lines += [f"FALLBACK {r.model}: {note}" for note in r.fallbacks]
        if r.error:
            lines.append(f"ERROR {r.model}: {r.error}")
    return "\n".join(lines)


def kokoro_batching(settings: Settings) -> dict[str, Any]:
    """Kokoro's batched fp32 decoder (four segments in one run) against the fp32 graph one
    segment at a time, on the profile's providers: whether batching gains on this device
    (`bench.kokoro_batch.measure_batch`); an error is reported, not raised."""
    from bench.kokoro_batch import measure_batch

    try:
        return {"providers": list(settings.providers),
                **measure_batch(settings.cache_dir, runtime_options(settings), repeats=2)}
    except Exception as error:  # a failed step never loses the rest of the run
        return {"error": f"{type(error).__name__}: {error}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default=os.environ.get("VOXMUX_PROFILE") or "gpu")
    parser.add_argument("--providers", help="comma list overriding the profile's providers")
    parser.add_argument("--models", help="comma list of catalogue models (default: all)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", type=Path, help="dir for the JSON results and one WAV per model")
    parser.add_argument("--runs", type=int, default=WARM_RUNS, help="warm syntheses per model")
    parser.add_argument("--allow-fallback", action="store_true",
                        help="exit 0 even when CUDA was requested but a model runs on CPU")
    parser.add_argument("--precisions", default="int8,fp32,fp16",
                        help="Kokoro graph precisions to sweep (comma list), or none")
    parser.add_argument("--concurrency", type=_ints, default=[1, 4, 8, 16],
                        help="concurrent requests per sweep level (comma list)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="requests each thread makes per sweep level")
    parser.add_argument("--piper-batch", type=_counts(1, 64), default="1,8",
                        help="Piper batch sizes to compare (comma list; 1 is off), or none")
    parser.add_argument("--instances", type=_counts(1, 16), default="1,2,4",
                        help="session counts of the instances sweep (comma list), or none")
    parser.add_argument("--sweep-concurrency", type=_ints, default=[1, 4, 8, 16, 32],
                        help="concurrent requests per cell of the instances sweep")
    parser.add_argument("--sweep-targets", type=_targets,
                        default="kokoro@CUDA,piper@CPU,piper@CUDA",
                        help="model@CUDA or model@CPU, comma list")
    parser.add_argument("--sweep-requests", type=int, default=0,
                        help="requests per cell (0: the concurrency, at least 4)")
    parser.add_argument("--sweep-budget", type=float, default=0,
                        help="seconds the instances sweep may take (0: no limit)")
    parser.add_argument("--kokoro-batch", choices=("on", "off"), default="on",
                        help="time Kokoro's batched fp32 decoder against one graph per "
                             "segment (bench/kokoro_batch.py) on the profile's providers")
    parser.add_argument("--text-lang", choices=("auto", "ja", "en"), default="auto",
                        help="Kokoro's text: Japanese, or English through eSpeak NG; auto: "
                             "Japanese when pyopenjtalk-plus and jieba are installed")
    args = parser.parse_args(argv)
    named = [] if args.precisions == "none" else args.precisions.split(",")
    wrong = [p for p in named if p not in PRECISIONS]
    if wrong:
        parser.error(f"unknown precision(s) {', '.join(wrong)}; known: {', '.join(PRECISIONS)}")
    precisions = [cast(Precision, p) for p in named]
    missing = missing_readers()
    if args.text_lang == "ja" and missing:
        parser.error(f"--text-lang ja needs {', '.join(missing)} (not installed)")
    english = args.text_lang == "en" or (args.text_lang == "auto" and bool(missing))
    texts = TEXTS | {"kokoro": TEXTS["default"]} if english else TEXTS
    if english and missing:
        stand_in_readers()

    overrides: dict[str, Any] = {"preload": []}
    if args.providers:
        overrides["providers"] = args.providers
    settings = load_settings(args.profile, **overrides)
    catalogue = Catalogue.load(settings.catalogue_path)
    wanted = args.models.split(",") if args.models else list(catalogue.models)
    unknown = [m for m in wanted if m not in catalogue.models]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(catalogue.models)}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)

    env = environment(settings)
    env["kokoro_text"] = "en" if english else "ja"
    env["cjk_readers"] = f"stand-ins ({', '.join(missing)} missing)" if english and missing \
        else "installed"
    logging.getLogger("engines").setLevel(logging.ERROR)  # fallbacks are printed below
    results = [check_model(catalogue.models[m], settings, args.out, args.runs, texts)
               for m in wanted]
    kokoro = any(SHORT_NAMES.get(catalogue.models[m].engine, catalogue.models[m].engine)
                 == SHORT_NAMES["kokoro"] for m in wanted)
    swept = sweep(settings, precisions, args.concurrency, args.rounds) if kokoro else []
    batches = args.piper_batch
    piper = any(SHORT_NAMES.get(catalogue.models[m].engine, catalogue.models[m].engine)
                == SHORT_NAMES["piper"] for m in wanted)
    batched = (gpu_sweep.piper_batching(settings, batches, args.concurrency, args.rounds)
               if piper and batches else [])
    kokoro_batch = kokoro_batching(settings) if kokoro and args.kokoro_batch == "on" else None
    counts = args.instances
    targets = [gpu_sweep.SweepTarget(model, provider) for model, provider in args.sweep_targets
               if model in wanted]
    deadline = time.monotonic() + args.sweep_budget if args.sweep_budget else None
    if end := os.environ.get("GPU_CHECK_END"):  # gpu_check.sh's time limit, less a cell's time
        until = time.monotonic() + float(end) - time.time() - SWEEP_MARGIN_S
        deadline = min(deadline, until) if deadline is not None else until
    cells, left_out = (gpu_sweep.instances_sweep(settings, targets, counts,
                                                 args.sweep_concurrency, args.sweep_requests,
                                                 deadline, vram=VramSampler)
                       if counts and targets else ([], []))
    payload = {"environment": env, "results": [asdict(r) for r in results],
               "kokoro_batch": kokoro_batch,
               "kokoro_precisions": [asdict(r) for r in swept],
               "piper_batching": [asdict(r) for r in batched],
               "cells": [asdict(c) for c in cells], "cells_left_out": left_out,
               "settings": {"precisions": precisions if kokoro else [],
                            "concurrency": args.concurrency, "rounds": args.rounds,
                            "piper_batch": batches, "instances": counts,
                            "sweep_concurrency": args.sweep_concurrency,
                            "sweep_targets": [asdict(t) for t in targets],
                            "sweep_requests": args.sweep_requests}}
    sweep_table = gpu_sweep.cells_markdown(cells) if cells else ""
    sweep_table += "".join(f"\nLEFT OUT {note}" for note in left_out)
    if kokoro_batch:
        sweep_table += f"\n\nKOKORO BATCH {json.dumps(kokoro_batch)}"
    table = (render(env, results) + ("\n\n" + gpu_sweep.render(swept) if swept else "")
             + ("\n\n" + gpu_sweep.batch_markdown(batched) if batched else "")
             + ("\n\n" + sweep_table if sweep_table else ""))
    print(json.dumps(payload, indent=2) if args.json else table)
    if args.out:
        (args.out / "gpu_check.json").write_text(json.dumps(payload, indent=2) + "\n")
        (args.out / "gpu_check.md").write_text(
            f"```\n{table}\n```\n" + ("\n" + gpu_sweep.markdown(swept) + "\n" if swept else "")
            + ("\n" + gpu_sweep.batch_markdown(batched) + "\n" if batched else "")
            + ("\n" + sweep_table + "\n" if sweep_table else ""))
    if any(r.error for r in [*results, *swept, *batched]):
        return 2
    swept_on_cpu = any(CUDA not in r.providers and any(CUDA in n for n in r.fallbacks)
                       for r in swept if r.providers)
    if (any(r.fell_back for r in results) or swept_on_cpu) and not args.allow_fallback:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
