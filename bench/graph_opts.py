"""onnxruntime graph optimization levels on each ONNX engine: session creation and run time.

    .venv/bin/python -m bench.graph_opts      # writes bench/results/graph_opts.json

For Kokoro and Piper, one sentence's real inputs (the engines' own phonemes) are run on sessions
made at each optimization level, and on a graph saved already optimized (`optimized_model_
filepath`, level `extended`, the portable one) and loaded with and without further optimization.
Median of 7 runs after a warm-up; sessions as VoxMux makes them (no spinning, no memory pattern).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from app.serving.wiring import runtime_options
from app.settings import load_settings
from bench.common import write_result
from engines.kokoro import KokoroEngine, assemble_model
from engines.piper import PiperEngine

TEXT = "The morning train left the station exactly on time, and nobody was late."
LEVELS = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


def _session(path: Path, level: ort.GraphOptimizationLevel, save: Path | None = None
             ) -> tuple[Any, float]:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if save is not None:
        options.optimized_model_filepath = str(save)
    started = time.perf_counter()
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session, time.perf_counter() - started


def _run_s(session: Any, feeds: dict[str, Any]) -> float:
    session.run(None, feeds)
    times = []
    for _ in range(7):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _rows(path: Path, feeds: dict[str, Any]) -> dict[str, dict[str, float]]:
    rows = {}
    for name, level in LEVELS.items():
        session, created = _session(path, level)
        rows[name] = {"create_s": round(created, 3), "run_s": round(_run_s(session, feeds), 4)}
    with tempfile.TemporaryDirectory() as folder:
        saved = Path(folder) / "optimized.onnx"
        _session(path, LEVELS["extended"], save=saved)
        for name, level in (("saved_then_all", LEVELS["all"]),
                            ("saved_no_more", ort.GraphOptimizationLevel.ORT_DISABLE_ALL)):
            session, created = _session(saved, level)
            rows[name] = {"create_s": round(created, 3),
                          "run_s": round(_run_s(session, feeds), 4)}
    for name, row in rows.items():
        print(f"  {name:>15}: {row}", flush=True)
    return rows


def kokoro_inputs(settings: Any) -> tuple[Path, dict[str, Any]]:
    engine = KokoroEngine(settings.cache_dir, None, runtime_options(settings))
    phonemes = engine.phonemize(TEXT, "jf_alpha")
    tokens = [engine._vocab[c] for c in phonemes if c in engine._vocab]
    style = engine._style_table("jf_alpha")[len(tokens) - 1].reshape(1, 256)
    return assemble_model(settings.cache_dir), {
        "tokens": np.array([[0, *tokens, 0]], dtype=np.int64), "style": style,
        "speed": np.array([1.0], dtype=np.float32)}


def piper_inputs(settings: Any) -> tuple[Path, dict[str, Any]]:
    engine = PiperEngine(None, runtime_options(settings))
    model = engine._embedded
    from engines.espeak_lib import espeak

    ids = model.phoneme_ids(espeak().phonemize(TEXT, model.espeak_voice))
    return model.path, {"input": np.array([ids], dtype=np.int64),
                        "input_lengths": np.array([len(ids)], dtype=np.int64),
                        "scales": np.array([0.667, 1.0, 0.8], dtype=np.float32)}


def main() -> None:
    settings = load_settings("cpu")
    result: dict[str, Any] = {"text": TEXT, "runs": 7, "statistic": "median", "engines": {}}
    for name, inputs in (("kokoro", kokoro_inputs), ("piper", piper_inputs)):
        print(name, flush=True)
        path, feeds = inputs(settings)
        result["engines"][name] = _rows(path, feeds)
    print("wrote", write_result("graph_opts", result))


if __name__ == "__main__":
    main()
