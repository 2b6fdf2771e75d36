"""Dynamic batching, measured before it is built: can segments of different requests share one
onnxruntime run, and does it pay on this machine?

    .venv/bin/python -m bench.batching            # writes bench/results/batching.json and .md
    .venv/bin/python -m bench.batching --quick    # a smoke test; numbers not meant

- Kokoro: the assembled int8 graph with its batch dimension made free, run on two segments.
- Piper: the embedded voice's graph (it has a batch dimension and `input_lengths`), the corpus'
  sentences phonemized as VoxMux does, `B` of them padded into one run against the same `B` run
  one by one, with the noise off (`noise_scale = noise_w = 0`) so both are deterministic:
  wall time of each, and how far each item's audio is from its own unbatched run (the longest
  item has no padding; the shorter ones are compared over their own length).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from app.serving.wiring import runtime_options
from app.settings import load_settings
from bench import load
from bench.common import run_benchmark, timed_phase

SIZES = (2, 4, 8)


def kokoro_batch() -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    from engines.kokoro import prepare_model

    model = onnx.load(prepare_model(load_settings("cpu").cache_dir, "int8"))
    for graph_input in model.graph.input:
        dims = graph_input.type.tensor_type.shape.dim
        if graph_input.name != "speed" and dims and dims[0].dim_value == 1:
            dims[0].ClearField("dim_value")
            dims[0].dim_param = "batch"
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    tokens = np.array([[0, *range(16, 48), 0]] * 2, dtype=np.int64)
    style = np.full((2, 256), 0.05, dtype=np.float32)
    try:
        outputs = session.run(None, {"tokens": tokens, "style": style,
                                     "speed": np.ones(1, dtype=np.float32)})
    except Exception as exc:  # what the graph says when asked for two at once
        return {"batches": False, "error": str(exc).splitlines()[0][:300]}
    return {"batches": True, "shapes": [list(o.shape) for o in outputs]}


def piper_items(engine: Any, texts: list[str]) -> list[list[int]]:
    from engines.piper import _phonemes

    model, _ = engine._resolve(engine.default_voice)
    items = []
    for text in texts:
        said = _phonemes(text, model.espeak_voice)
        ids, _ = model.phoneme_ids_owned(said, [-1] * len(said))
        items.append(ids)
    return items


def piper_batch(quick: bool) -> dict[str, Any]:
    from engines.piper import PiperEngine, _padded, _parts

    settings = load_settings("cpu")
    engine = PiperEngine.from_settings(settings, runtime_options(settings))
    engine.load()
    model, _ = engine._resolve(engine.default_voice)
    session = model.session
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)

    def one(ids: list[int]) -> np.ndarray:
        out = session.run(None, {"input": np.array([ids], dtype=np.int64),
                                 "input_lengths": np.array([len(ids)], dtype=np.int64),
                                 "scales": scales})
        return np.asarray(out[0]).reshape(-1)

    def batched(items: list[list[int]]) -> list[np.ndarray]:
        """The engine's own padding and split (`engines.piper`): each item's audio."""
        feeds = [{"input": np.array([ids], dtype=np.int64),
                  "input_lengths": np.array([len(ids)], dtype=np.int64), "scales": scales}
                 for ids in items]
        parts = _parts(feeds, session.run(None, _padded(feeds)))
        return [np.asarray(part[0]).reshape(-1) for part in parts]

    rounds = 2 if quick else 5
    results = []
    for size in SIZES[:2] if quick else SIZES:
        items = piper_items(engine, [load.text(1, k) for k in range(size)])
        alone = [one(ids) for ids in items]
        audio = batched(items)
        worst_longest, worst_shorter, tail_ms = 0.0, 0.0, 0.0
        longest = max(range(size), key=lambda k: len(items[k]))
        for k, reference in enumerate(alone):
            if audio[k].size != reference.size:
                raise RuntimeError(f"item {k}: {audio[k].size} samples batched, "
                                   f"{reference.size} alone")
            diff = np.abs(audio[k] - reference)
            if k == longest:
                worst_longest = max(worst_longest, float(diff.max()))
                continue
            worst_shorter = max(worst_shorter, float(diff.max()))
            off = np.nonzero(diff > 1e-3)[0]
            if off.size:
                tail_ms = max(tail_ms, (reference.size - off[0]) / engine.sample_rate * 1000)
        sequential, together = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            for ids in items:
                one(ids)
            sequential.append(time.perf_counter() - started)
            started = time.perf_counter()
            batched(items)
            together.append(time.perf_counter() - started)
        seq, bat = statistics.median(sequential), statistics.median(together)
        results.append({
            "size": size, "phonemes": [len(i) for i in items],
            "sequential_s": round(seq, 4), "batched_s": round(bat, 4),
            "batched_over_sequential": round(bat / seq, 3),
            "max_diff_longest": worst_longest, "max_diff_shorter": worst_shorter,
            "shorter_differ_from_end_ms": round(tail_ms, 1),
        })
        print(results[-1], flush=True)
    engine.unload()
    return {"piper": results}


def measure(quick: bool) -> dict[str, Any]:
    phases: dict[str, Any] = {}
    result: dict[str, Any] = {"quick": quick, "phases": phases}
    with timed_phase("kokoro", phases):
        result["kokoro"] = kokoro_batch()
    with timed_phase("piper", phases):
        result.update(piper_batch(quick))
    return result


def summary(data: dict[str, Any]) -> str:
    machine = data["machine"]
    kokoro = data["kokoro"]
    lines = [
        "# Batching: one run for segments of several requests",
        "",
        f"{machine.get('cpus')} CPUs ({machine.get('cpu_model')}), {machine.get('date')}; "
        "Piper's embedded voice with its noise off, CPU provider, default threads.",
        "",
        "Kokoro (int8 graph, batch dimension made free, two segments): "
        + ("runs" if kokoro["batches"] else f"refused: `{kokoro['error']}`"),
        "",
        "| Piper segments | phonemes | one by one (s) | padded into one run (s) | run / one by one "
        "| max diff, longest | max diff, shorter | shorter differ from (ms before their end) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["piper"]:
        lines.append(
            f"| {row['size']} | {', '.join(map(str, row['phonemes']))} | {row['sequential_s']} "
            f"| {row['batched_s']} | {row['batched_over_sequential']} "
            f"| {row['max_diff_longest']:.2g} | {row['max_diff_shorter']:.2g} "
            f"| {row['shorter_differ_from_end_ms']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_benchmark("batching", __doc__.splitlines()[0], measure, summary)
