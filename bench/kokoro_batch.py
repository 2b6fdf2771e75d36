"""Kokoro's batched fp32 graphs (`engines/kokoro_batch.py`) against the one-graph fp32 run:
`B` segments of different lengths run one by one through the whole graph, then through the
encoder one by one and the batched decoder once; wall time of each and the largest sample
difference of each segment from its own one-graph run.

    .venv/bin/python -m bench.kokoro_batch            # writes bench/results/kokoro_batch.json, .md
    .venv/bin/python -m bench.kokoro_batch --quick    # a smoke test; numbers not meant

`measure_batch(cache_dir, runtime, texts)` is the same measurement on any provider, for a GPU
check to call with its own `RuntimeOptions`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from engines.kokoro import MODEL_FILE, KokoroEngine, prepare_model
from engines.kokoro_batch import ASR, ENERGY, F0, FRAMES, batch_graphs, padded, parts
from engines.onnx import RuntimeOptions, open_session

TEXTS = (
    "Good morning.",
    "The quick brown fox jumps over the lazy dog, then runs far into the woods.",
    "Several segments of different lengths share one run.",
    "A fourth sentence, somewhat longer again, to see how the padding behaves when the "
    "lengths differ a lot.",
)
VOICE = "jf_alpha"


def measure_batch(cache_dir: Path, runtime: RuntimeOptions, texts: tuple[str, ...] = TEXTS,
                  repeats: int = 2) -> dict[str, Any]:
    """Seconds for `texts` one by one through the fp32 graph and as one batched decoder run
    (best of `repeats`, after one warm-up each), and each segment's max abs difference."""
    engine = KokoroEngine(cache_dir, None, RuntimeOptions())
    stamp = (cache_dir / (MODEL_FILE + ".sha256")).read_text().strip()
    fp32 = prepare_model(cache_dir, "fp32")
    first, second = batch_graphs(fp32, stamp)
    whole, encoder, decoder = (open_session(p, runtime) for p in (fp32, first, second))
    feeds = []
    for text in texts:
        tokens = [engine._vocab[c] for c in engine.phonemize(text, VOICE, "en-us")
                  if c in engine._vocab]
        style = engine._style_table(VOICE)[len(tokens) - 1].reshape(1, 256)
        feeds.append({"tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
                      "style": style.astype(np.float32),
                      "speed": np.array([1.0], dtype=np.float32)})

    def one_by_one() -> list[np.ndarray]:
        return [whole.run(None, f)[0].reshape(-1) for f in feeds]

    def batched() -> list[np.ndarray]:
        items = []
        for f in feeds:
            asr, f0, energy, _ = encoder.run(None, f)
            items.append({ASR: asr, F0: f0, ENERGY: energy, "style": f["style"],
                          FRAMES: np.array([asr.shape[-1]], dtype=np.int64)})
        return [p[0].reshape(-1) for p in parts(items, decoder.run(None, padded(items)))]

    times: dict[str, list[float]] = {"one_by_one": [], "batched": []}
    outputs: dict[str, list[np.ndarray]] = {}
    for _ in range(repeats + 1):
        for name, run in (("one_by_one", one_by_one), ("batched", batched)):
            started = time.perf_counter()
            outputs[name] = run()
            times[name].append(time.perf_counter() - started)
    samples = [len(a) for a in outputs["one_by_one"]]
    return {
        "segments": len(texts),
        "audio_seconds": round(sum(samples) / 24_000, 2),
        "one_by_one_s": round(min(times["one_by_one"][1:]), 3),
        "batched_s": round(min(times["batched"][1:]), 3),
        "max_abs_diff": [float(np.abs(a - b).max()) if len(a) == len(b) else None
                         for a, b in zip(outputs["one_by_one"], outputs["batched"], strict=True)],
    }


def _measure(quick: bool) -> dict[str, Any]:
    from tests.conftest import CACHE_DIR

    return measure_batch(CACHE_DIR, RuntimeOptions(), TEXTS[:2] if quick else TEXTS,
                         repeats=1)


def _summary(data: dict[str, Any]) -> str:
    diffs = ", ".join(f"{d:.1e}" for d in data["max_abs_diff"])
    return (
        "# Kokoro: batched fp32 decoder against one graph per segment\n\n"
        f"CPU provider, default threads; {data['segments']} segments, "
        f"{data['audio_seconds']} s of audio.\n\n"
        "| one by one (s) | encoders + one batched decoder run (s) | max abs diff per segment |\n"
        "|---|---|---|\n"
        f"| {data['one_by_one_s']} | {data['batched_s']} | {diffs} |\n")


if __name__ == "__main__":
    from bench.common import run_benchmark

    run_benchmark("kokoro_batch", __doc__ or "", _measure, _summary)
