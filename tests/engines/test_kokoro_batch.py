"""Kokoro's batched float graphs: segments of different lengths in one padded decoder run speak
the samples the one-graph run speaks for each of them alone (within 1e-3, measured about 3e-6),
on this machine, in this run."""

from __future__ import annotations

import io
import threading
import wave
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines.base import SynthesisRequest
from engines.kokoro import MODEL_FILE, KokoroEngine, prepare_model
from engines.kokoro_batch import (
    ASR,
    ENERGY,
    F0,
    FRAMES,
    batch_graphs,
    graph_files,
    padded,
    parts,
)
from engines.kokoro_float import Precision
from engines.onnx import RuntimeOptions
from tests.conftest import CACHE_DIR, decode

SENTENCES = [  # three lengths, the longest over three times the shortest: it pads the others
    "Good morning.",
    "Several segments share one run.",
    "Segments of different lengths share one padded run.",
]
TOLERANCE = 1e-3
VOICE = "jf_alpha"


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def engine() -> KokoroEngine:
    """An unbatched fp32 engine: the reference, and the tokens of each sentence."""
    kokoro = KokoroEngine(CACHE_DIR, None, RuntimeOptions(), "fp32")
    kokoro.load()
    return kokoro


def _feeds(engine: KokoroEngine, text: str) -> dict[str, np.ndarray]:
    vocab = engine._vocab
    tokens = [vocab[c] for c in engine.phonemize(text, VOICE, "en-us") if c in vocab]
    style = engine._style_table(VOICE)[len(tokens) - 1].reshape(1, 256)
    return {"tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
            "style": style.astype(np.float32), "speed": np.array([1.0], dtype=np.float32)}


def _wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(24_000)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def test_padded_decoder_run_equals_each_segment_alone(engine: KokoroEngine) -> None:
    stamp = (CACHE_DIR / (MODEL_FILE + ".sha256")).read_text().strip()
    first, second = batch_graphs(prepare_model(CACHE_DIR, "fp32"), stamp)
    assert engine._pool is not None
    whole = engine._pool.sessions[0]  # the one-graph fp32 session the engine opened
    encoder, decoder = _session(first), _session(second)
    alone, items = [], []
    for text in SENTENCES:
        feeds = _feeds(engine, text)
        audio, durations = whole.run(None, feeds)
        asr, f0, energy, frames = encoder.run(None, feeds)
        np.testing.assert_array_equal(frames, durations)
        alone.append(audio.reshape(-1))
        items.append({ASR: asr, F0: f0, ENERGY: energy, "style": feeds["style"],
                      FRAMES: np.array([asr.shape[-1]], dtype=np.int64)})
    assert len({item[FRAMES][0] for item in items}) == len(items)  # all lengths differ
    batch = padded(items)
    together = parts(items, decoder.run(None, batch))
    for reference, (samples,) in zip(alone, together, strict=True):
        assert samples.shape == (1, len(reference))
        assert np.abs(samples[0] - reference).max() < TOLERANCE
        heard = decode(_wav(samples[0]), "wav")
        assert heard.sample_rate == 24_000
        assert heard.duration == pytest.approx(len(reference) / 24_000, abs=0.01)
        assert heard.rms > 0.01  # speech, not silence
    # Without its frames the padded items are normalised over the padding too: far off.
    unmasked = dict(batch, **{FRAMES: np.full(len(items), batch[ASR].shape[-1])})
    shortest = parts(items, decoder.run(None, unmasked))[0][0][0]
    assert np.abs(shortest - alone[0]).max() > 100 * TOLERANCE


def test_concurrent_requests_share_decoder_runs_and_speak_as_alone(engine: KokoroEngine
                                                                    ) -> None:
    batched = KokoroEngine(CACHE_DIR, None, RuntimeOptions(batch_size=3, batch_wait=2.0), "fp32")
    assert batched.capabilities.batching
    batched.load()
    texts = SENTENCES[:3]
    results: dict[int, np.ndarray] = {}

    def speak(k: int) -> None:
        results[k] = batched.synthesize(SynthesisRequest(texts[k], VOICE, language="en-us")
                                        )

    threads = [threading.Thread(target=speak, args=(k,)) for k in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batched._batched is not None and max(batched._batched.batcher.runs) > 1
    for k, text in enumerate(texts):
        alone = engine.synthesize(SynthesisRequest(text, VOICE, language="en-us"))
        assert results[k].shape == alone.shape
        assert np.abs(results[k] - alone).max() < TOLERANCE
    batched.unload()
    assert batched._batched is None


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_only_the_fp32_graph_batches(precision: Precision) -> None:
    """int8 quantizes its activations per tensor (one item's peak would set the others' steps);
    fp16 in two parts spoke 0.03-0.07 away from its one-graph run."""
    kokoro = KokoroEngine(CACHE_DIR, None, RuntimeOptions(batch_size=4), precision)
    assert not kokoro.capabilities.batching


def test_a_batching_engine_opens_no_session_of_the_whole_graph(monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Its calls run on the encoder and the batched decoder: a session of the one-graph fp32
    model beside them would hold a third copy of the weights that no call uses."""
    import engines.kokoro
    import engines.kokoro_batch
    import engines.onnx

    opened: list[str] = []
    real = engines.onnx.open_session

    def spy(model: Path | bytes, *args: object, **kwargs: object) -> ort.InferenceSession:
        opened.append(Path(str(model)).name)
        return real(model, *args, **kwargs)  # type: ignore[arg-type]

    for module in (engines.onnx, engines.kokoro, engines.kokoro_batch):
        monkeypatch.setattr(module, "open_session", spy)
    kokoro = KokoroEngine(CACHE_DIR, None, RuntimeOptions(batch_size=2), "fp32")
    kokoro.load()
    assert sorted(opened) == sorted(graph_files())
    assert kokoro.loaded and kokoro.providers() == ("CPUExecutionProvider",)
    audio = kokoro.synthesize(SynthesisRequest(SENTENCES[0], VOICE, language="en-us"))
    heard = decode(_wav(audio), "wav")
    assert 0.5 < heard.duration < 5 and heard.rms > 0.01
    kokoro.unload()
    assert not kokoro.loaded and kokoro.providers() == ()
