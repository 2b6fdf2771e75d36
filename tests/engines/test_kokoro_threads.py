"""Kokoro's threads on CPU: a call that runs alone spreads over every core; calls that overlap
run on one core each, in a one-thread session, and speak the same samples."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import engines.kokoro as kokoro
from engines.base import LoadFailed, SynthesisRequest, lane_concurrency
from engines.kokoro import KokoroEngine
from engines.kokoro_float import Precision
from engines.onnx import CUDA, RuntimeOptions, usable_cores
from tests.conftest import CACHE_DIR

TEXT = "Two calls at once run on a core each."
pytestmark = pytest.mark.skipif(usable_cores() < 2, reason="one core: nothing to share")


@pytest.fixture(scope="module")
def engine() -> Iterator[KokoroEngine]:
    made = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    made.load()
    yield made
    made.unload()


def _threads(session: Any) -> int:
    return int(session.get_session_options().intra_op_num_threads)


def _say(engine: KokoroEngine) -> np.ndarray:
    return engine.synthesize(SynthesisRequest(text=TEXT, voice="jf_alpha"))


def test_a_lone_call_uses_every_core_and_overlapping_calls_one_each(
        engine: KokoroEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    used: dict[str, int] = {}
    second_chose = threading.Event()
    real_run = kokoro.run

    def spy(session: Any, *args: Any) -> list[Any]:
        name = threading.current_thread().name
        used[name] = _threads(session)
        if name == "first":  # holds its inference until the second call has chosen a session
            assert second_chose.wait(30)
        else:
            second_chose.set()
        return real_run(session, *args)

    alone = _say(engine)
    monkeypatch.setattr(kokoro, "run", spy)
    out: dict[str, np.ndarray] = {}

    def call(name: str) -> None:
        out[name] = _say(engine)

    first = threading.Thread(target=call, args=("first",), name="first")
    first.start()
    while "first" not in used and first.is_alive():
        first.join(0.01)
    second = threading.Thread(target=call, args=("second",), name="second")
    second.start()
    first.join(60)
    second.join(60)
    assert used == {"first": 0, "second": 1}  # 0: onnxruntime's own choice, a thread per core
    for name in ("first", "second"):  # the one-thread session says the same samples
        assert out[name].shape == alone.shape
        np.testing.assert_allclose(out[name], alone, atol=1e-4)
    assert engine.capabilities.cores_per_call == 1
    assert lane_concurrency(1, engine.capabilities, usable_cores()) == usable_cores()


def test_a_set_thread_count_a_gpu_or_fp32_keeps_one_session_and_one_call() -> None:
    cases: list[tuple[RuntimeOptions, Precision]] = [
        (RuntimeOptions(intra_op_threads=2), "int8"), (RuntimeOptions(providers=(CUDA,)), "int8"),
        (RuntimeOptions(), "fp32")]  # fp32's one-thread session differs by ~1e-6: not byte-stable
    for runtime, precision in cases:
        made = KokoroEngine(CACHE_DIR, None, runtime, precision)
        assert made.capabilities.cores_per_call == 0
        assert lane_concurrency(1, made.capabilities, usable_cores()) == 1
        assert not made._adaptive  # load() opens no one-thread session


def test_unload_closes_both_sessions() -> None:
    made = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    made.load()
    assert made.providers() == ("CPUExecutionProvider",)
    assert made._narrow is not None
    made.unload()
    assert made._pool is None and made._narrow is None and made.providers() == ()


def test_a_second_session_that_fails_to_open_leaves_kokoro_unloaded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = kokoro.open_session

    def failing(model: Any, runtime: RuntimeOptions, intra_op_threads: int | None = None) -> Any:
        if intra_op_threads == 1:
            raise RuntimeError("out of memory")
        return real_open(model, runtime, intra_op_threads)

    monkeypatch.setattr(kokoro, "open_session", failing)
    made = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    with pytest.raises(LoadFailed, match="out of memory"):
        made.load()
    assert not made.loaded and made.providers() == ()


def test_a_call_under_way_finishes_when_kokoro_is_unloaded(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """An unload that does not wait (the server's shutdown) drops the engine's sessions; a text
    of several inferences that is under way finishes on the ones it started with."""
    monkeypatch.setattr(kokoro, "MAX_TOKENS", 12)  # a short text in several inferences
    made = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    made.load()
    stream = made.stream(SynthesisRequest(text=TEXT, voice="jf_alpha"))
    first = next(stream)
    made.unload()
    rest = list(stream)
    assert first.size > 0 and len(rest) >= 2 and all(piece.size > 0 for piece in rest)
