"""Kokoro's batched float graphs: segments of different lengths in one padded decoder run speak
the samples the one-graph run speaks for each of them alone (within 1e-3, measured about 3e-6),
on this machine, in this run."""

from __future__ import annotations

import io
import threading
import wave
from dataclasses import dataclass
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
from engines.onnx import RuntimeOptions, SessionPool
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


@dataclass
class Alone:
    """One sentence as the unbatched engine says it: the feeds of its one inference, and the
    one-graph run's audio and durations."""
    feeds: dict[str, np.ndarray]
    audio: np.ndarray
    durations: np.ndarray


class _Recorder:
    """A session that keeps the feeds and outputs of each run."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session = session
        self.runs: list[tuple[dict[str, np.ndarray], list[np.ndarray]]] = []

    def run(self, names: object, feeds: dict[str, np.ndarray], options: object = None
            ) -> list[np.ndarray]:
        outputs: list[np.ndarray] = self.session.run(names, feeds, options)
        self.runs.append((feeds, outputs))
        return outputs


@pytest.fixture(scope="module")
def alone(engine: KokoroEngine) -> list[Alone]:
    """What the unbatched engine says for each sentence, said once for the module: the
    reference both for the padded decoder run and for the batching engine."""
    pool = engine._pool
    assert pool is not None
    recorder = _Recorder(pool.sessions[0])
    engine._pool = SessionPool([recorder])
    try:
        said = [engine.synthesize(SynthesisRequest(text, VOICE, language="en-us"))
                for text in SENTENCES]
    finally:
        engine._pool = pool
    assert len(recorder.runs) == len(SENTENCES)  # one inference each
    return [Alone(feeds, audio, outputs[1])
            for audio, (feeds, outputs) in zip(said, recorder.runs, strict=True)]


def _wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(24_000)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def test_padded_decoder_run_equals_each_segment_alone(alone: list[Alone]) -> None:
    stamp = (CACHE_DIR / (MODEL_FILE + ".sha256")).read_text().strip()
    first, second = batch_graphs(prepare_model(CACHE_DIR, "fp32"), stamp)
    encoder, decoder = _session(first), _session(second)
    items = []
    for said in alone:
        asr, f0, energy, frames = encoder.run(None, said.feeds)
        np.testing.assert_array_equal(frames, said.durations)
        items.append({ASR: asr, F0: f0, ENERGY: energy, "style": said.feeds["style"],
                      FRAMES: np.array([asr.shape[-1]], dtype=np.int64)})
    assert len({item[FRAMES][0] for item in items}) == len(items)  # all lengths differ
    together = parts(items, decoder.run(None, padded(items)))
    for reference, (samples,) in zip((said.audio for said in alone), together, strict=True):
        assert samples.shape == (1, len(reference))
        assert np.abs(samples[0] - reference).max() < TOLERANCE
        heard = decode(_wav(samples[0]), "wav")
        assert heard.sample_rate == 24_000
        assert heard.duration == pytest.approx(len(reference) / 24_000, abs=0.01)
        assert heard.rms > 0.01  # speech, not silence
    # Without its frames the shortest item, padded to the longest, is normalised over the
    # padding too: far off.
    pair = [items[0], max(items, key=lambda item: int(item[FRAMES][0]))]
    batch = padded(pair)
    unmasked = dict(batch, **{FRAMES: np.full(len(pair), batch[ASR].shape[-1])})
    shortest = parts(pair, decoder.run(None, unmasked))[0][0][0]
    assert np.abs(shortest - alone[0].audio).max() > 100 * TOLERANCE


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_only_the_fp32_graph_batches(precision: Precision) -> None:
    """int8 quantizes its activations per tensor (one item's peak would set the others' steps);
    fp16 in two parts spoke 0.03-0.07 away from its one-graph run."""
    kokoro = KokoroEngine(CACHE_DIR, None, RuntimeOptions(batch_size=4), precision)
    assert not kokoro.capabilities.batching


def test_a_batching_engine_opens_no_whole_graph_and_its_concurrent_requests_speak_as_alone(
        alone: list[Alone], monkeypatch: pytest.MonkeyPatch) -> None:
    """Its calls run on the encoder and the batched decoder: a session of the one-graph fp32
    model beside them would hold a third copy of the weights that no call uses. Calls at once
    share decoder runs and say the samples the unbatched engine says for each alone."""
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
    batched = KokoroEngine(CACHE_DIR, None, RuntimeOptions(batch_size=3, batch_wait=2.0), "fp32")
    assert batched.capabilities.batching
    batched.load()
    assert sorted(opened) == sorted(graph_files())
    assert batched.loaded and batched.providers() == ("CPUExecutionProvider",)
    results: dict[int, np.ndarray] = {}

    def speak(k: int) -> None:
        results[k] = batched.synthesize(SynthesisRequest(SENTENCES[k], VOICE, language="en-us"))

    threads = [threading.Thread(target=speak, args=(k,)) for k in range(len(SENTENCES))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batched._batched is not None and max(batched._batched.batcher.runs) > 1
    for k, said in enumerate(alone):
        assert results[k].shape == said.audio.shape
        assert np.abs(results[k] - said.audio).max() < TOLERANCE
        heard = decode(_wav(results[k]), "wav")
        assert heard.sample_rate == 24_000 and heard.rms > 0.01
    batched.unload()
    assert batched._batched is None
    assert not batched.loaded and batched.providers() == ()
