"""English on the three neural models: what Whisper hears, how fast, how soon, and Kokoro's
English phonemes from eSpeak NG against hibari's G2P.

    .venv/bin/python -m bench.english            # writes bench/results/english.json and .md
    .venv/bin/python -m bench.english --quick    # a smoke test; numbers not meant

- Word error rate: Whisper tiny.en (`tests.hearing`, greedy, float32) on the sentences of the
  intelligibility tests (`tests/app/protocols/test_intelligibility.py`: times, phone numbers,
  money, years) and the five plain sentences of `tests/app/routes/test_native.py`, each model's
  engine in this process on its default voice for OpenAI's `alloy` (`config/models.toml`).
  Digits count one by one, as in those tests.
- Kokoro twice: its English as VoxMux reads it (eSpeak NG's phonemes, mapped to Kokoro's
  symbols) and from hibari's G2P (misaki's lexicon rules, the phonemes Kokoro was trained on);
  same voice, same graph.
- Throughput: audio seconds per wall second over that corpus, one sentence per call, one call at
  a time, in this process.
- First audio: `voxmux serve` on the cpu profile (cache off), five sentences streamed as pcm,
  median over rounds; the first segment is VoxMux's short first one.
"""

from __future__ import annotations

import re
import statistics
import time
from contextlib import ExitStack
from typing import Any

import numpy as np

from app.serving.wiring import runtime_options
from app.settings import load_settings
from bench import load
from bench.common import run_benchmark, timed_phase, voxmux_process
from bench.systems import VoxMuxClient
from engines.base import CancelToken, Engine, SynthesisRequest
from engines.hibari import HibariEngine
from engines.kokoro import KokoroEngine
from engines.onnx import run
from engines.piper import PiperEngine
from tests.app.protocols.test_intelligibility import SENTENCES as INTELLIGIBILITY
from tests.app.protocols.test_intelligibility import wer
from tests.app.routes.test_native import SENTENCES as PLAIN

CORPUS = [*INTELLIGIBILITY, *re.split(r"(?<=\.)\s+", PLAIN.strip())]
VOICES = {"hibari": "heart", "piper": "en_US-joe-medium", "kokoro": "jf_alpha"}
VOXMUX_ENV = {"VOXMUX_PRELOAD": "hibari,piper,kokoro", "VOXMUX_CACHE_MAX_ITEMS": "0",
              "VOXMUX_IDLE_TTL": "-1"}


def kokoro_with_hibari_g2p(kokoro: KokoroEngine, reader: Any, text: str, voice: str
                           ) -> np.ndarray:
    """Kokoro's graph on hibari's phonemes (its vocabulary is misaki's: no mapping needed)."""
    chunks = []
    table = kokoro._style_table(voice)
    for chunk in reader.read(text, timings=False).chunks:
        tokens = [kokoro._vocab[c] for c in chunk.phonemes if c in kokoro._vocab]
        style = table[min(len(tokens), len(table)) - 1].reshape(1, 256)
        audio = run(kokoro._session, {
            "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
            "style": style.astype(np.float32), "speed": np.array([1.0], dtype=np.float32),
        }, CancelToken())[0]
        chunks.append(np.asarray(audio, dtype=np.float32).reshape(-1))
    return np.concatenate(chunks)


def measure(quick: bool) -> dict[str, Any]:
    settings = load_settings("cpu")
    runtime = runtime_options(settings)
    corpus = CORPUS[:4] if quick else CORPUS
    phases: dict[str, Any] = {}
    result: dict[str, Any] = {"quick": quick, "corpus": corpus, "voices": VOICES,
                              "phases": phases}
    engines: dict[str, Engine] = {
        "hibari": HibariEngine.from_settings(settings, runtime),
        "piper": PiperEngine.from_settings(settings, runtime),
        "kokoro": KokoroEngine.from_settings(settings, runtime),
    }
    for engine in engines.values():
        engine.load()
    kokoro = engines["kokoro"]
    assert isinstance(kokoro, KokoroEngine)
    hibari = engines["hibari"]
    assert isinstance(hibari, HibariEngine)
    reader = hibari._readers[False]
    makers = {name: (lambda text, e=engine, v=VOICES[name]: e.synthesize(
        SynthesisRequest(text, v))) for name, engine in engines.items()}
    makers["kokoro_hibari_g2p"] = lambda text: kokoro_with_hibari_g2p(
        kokoro, reader, text, VOICES["kokoro"])
    rates = {name: engines[name.split("_")[0]].sample_rate for name in makers}
    rows: dict[str, Any] = {}
    with timed_phase("hearing", phases):
        for name, make in makers.items():
            make("Warm up.")
            errors, audio_s, wall = [], 0.0, 0.0
            for text in corpus:
                started = time.perf_counter()
                audio = make(text)
                wall += time.perf_counter() - started
                audio_s += len(audio) / rates[name]
                errors.append(round(wer(text, audio, rates[name]), 3))
            rows[name] = {"wer_mean": round(statistics.fmean(errors), 3),
                          "wer_median": round(statistics.median(errors), 3),
                          "wer": errors, "audio_s_per_s": round(audio_s / wall, 1)}
            print(f"  {name:>18}: {rows[name]}", flush=True)
    for engine in engines.values():
        engine.unload()
    with timed_phase("first_audio", phases), ExitStack() as stack:
        vox = stack.enter_context(voxmux_process(VOXMUX_ENV))
        clients = [VoxMuxClient(vox.url, name=model, model=model) for model in VOICES]
        for client in clients:
            stack.callback(client.close)
            client.request(load.text(1, 0))
        rounds = 2 if quick else 7
        for client in clients:
            firsts = [client.request(load.text(5, r)).ttfa for r in range(rounds)]
            rows[client.name]["first_audio_ms"] = round(statistics.median(firsts) * 1000)
    result["models"] = rows
    return result


def summary(result: dict[str, Any]) -> str:
    machine = result["machine"]
    rows = result["models"]
    lines = ["# English: hibari, Piper and Kokoro", "",
             f"{machine['cpus']} CPUs ({machine['cpu_model']}), Python {machine['python']}, "
             f"{machine['date']}; {len(result['corpus'])} sentences; Whisper tiny.en.", "",
             "| model (voice) | WER mean | WER median | audio s per s, one call at a time | "
             "first audio over VoxMux, 5 sentences |", "|---|---|---|---|---|"]
    names = {"hibari": "hibari (heart)", "piper": "piper (en_US-joe-medium)",
             "kokoro": "kokoro (jf_alpha), eSpeak NG phonemes",
             "kokoro_hibari_g2p": "kokoro (jf_alpha), hibari's G2P"}
    for key, label in names.items():
        row = rows[key]
        first = f"{row['first_audio_ms']} ms" if "first_audio_ms" in row else ""
        lines.append(f"| {label} | {row['wer_mean']:.3f} | {row['wer_median']:.3f} | "
                     f"{row['audio_s_per_s']:.1f} | {first} |")
    lines += ["", "Per sentence (WER):", ""]
    for key in names:
        lines.append(f"- {key}: {rows[key]['wer']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_benchmark("english", __doc__.splitlines()[0], measure, summary)
