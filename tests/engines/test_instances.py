"""Several sessions of one graph (`VOXMUX_INSTANCES`): calls that overlap run on different
sessions at once, speak the samples one session speaks, and give their session back however
they end. On CPU, as the tests run; on a GPU each session is a CUDA stream of its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import engines.kokoro as kokoro
from engines.base import Cancelled, CancelToken, SynthesisRequest, lane_concurrency
from engines.kokoro import KokoroEngine
from engines.kokoro_float import Precision
from engines.onnx import RuntimeOptions, SessionPool, usable_cores
from engines.piper import PiperEngine
from tests.conftest import CACHE_DIR

TEXT = "Two calls at once."  # short: what overlaps is the calls, not their length
LONG = ("The lighthouse keeper climbed the spiral stairs every evening, counting each step, "
        "listening to the wind, and wondering whether the ships far out at sea could see "
        "the small warm light he tended so carefully through the long cold night")


def _until(condition: Callable[[], bool], what: str, seconds: float = 60) -> None:
    """Wait for `condition` (a state to reach, not a speed: the bound only ends a hang)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.005)


def _say(engine: KokoroEngine, text: str = TEXT, cancel: CancelToken | None = None
         ) -> np.ndarray:
    request = SynthesisRequest(text=text, voice="jf_alpha", cancel=cancel or CancelToken())
    return engine.synthesize(request)


@pytest.fixture(scope="module", params=["int8", "fp32"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[KokoroEngine, np.ndarray]]:
    """Kokoro with two instances, and what one of them says for TEXT in a call of its own (no
    other call under way: one session, two threads, as a one-instance engine runs it)."""
    precision: Precision = request.param
    made = KokoroEngine(CACHE_DIR, None, RuntimeOptions(intra_op_threads=2, instances=2),
                        precision)
    made.load()
    pool = made._pool
    assert pool is not None and pool.busy() == (0, 0)
    alone = _say(made)
    assert pool.busy() == (0, 0)
    yield made, alone
    made.unload()


def test_overlapping_calls_run_on_both_instances_at_once_and_say_what_one_says(
        pair: tuple[KokoroEngine, np.ndarray], monkeypatch: pytest.MonkeyPatch) -> None:
    engine, alone = pair
    pool = engine._pool
    assert isinstance(pool, SessionPool) and len(pool) == 2
    both_in = threading.Event()
    seen: dict[str, tuple[int, ...]] = {}
    used: dict[str, int] = {}
    real_run = kokoro.run

    def spy(session: Any, *args: Any) -> list[Any]:
        name = threading.current_thread().name
        used[name] = pool.sessions.index(session)
        if pool.busy() == (1, 1):  # both calls are inside an instance now
            seen[name] = pool.busy()
            both_in.set()
        assert both_in.wait(60)  # neither runs until both have taken one
        return real_run(session, *args)

    monkeypatch.setattr(kokoro, "run", spy)
    out: dict[str, np.ndarray] = {}
    threads = [threading.Thread(target=lambda n=n: out.__setitem__(n, _say(engine)), name=n)
               for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert seen and sorted(used.values()) == [0, 1], (seen, used)
    assert pool.busy() == (0, 0)
    for name in ("a", "b"):
        np.testing.assert_array_equal(out[name], alone)


def test_the_lane_lets_one_call_in_per_instance(pair: tuple[KokoroEngine, np.ndarray]) -> None:
    engine, _ = pair
    assert engine.capabilities.instances == 2
    assert lane_concurrency(1, engine.capabilities, usable_cores()) == 2
    assert lane_concurrency(4, engine.capabilities, usable_cores()) == 4
    report = engine.instances()
    assert report is not None and report.count == 2 and report.busy == (0, 0)
    assert report.vram_mib is None and report.vram_note == "runs on the CPU"


def test_a_cancel_inside_either_instance_gives_it_back(pair: tuple[KokoroEngine, np.ndarray]
                                                       ) -> None:
    engine, _ = pair
    pool = engine._pool
    assert pool is not None
    tokens = {name: CancelToken() for name in ("a", "b")}
    errors: dict[str, BaseException] = {}

    def call(name: str) -> None:
        try:
            _say(engine, LONG, tokens[name])
        except BaseException as exc:
            errors[name] = exc

    first = threading.Thread(target=call, args=("a",))
    first.start()
    _until(lambda: pool.busy() == (1, 0), "the first call in the first instance")
    second = threading.Thread(target=call, args=("b",))
    second.start()
    _until(lambda: pool.busy() == (1, 1), "the second call in the second instance")
    tokens["b"].cancel()  # the one in the second instance, mid-inference
    second.join(60)
    assert isinstance(errors.get("b"), Cancelled)
    assert pool.busy() == (1, 0)
    tokens["a"].cancel()
    first.join(60)
    assert isinstance(errors.get("a"), Cancelled)
    assert pool.busy() == (0, 0)
    assert _say(engine).size > 10_000  # both instances serve on


def test_piper_opens_its_instances_and_reports_them() -> None:
    engine = PiperEngine(None, RuntimeOptions(instances=3))
    assert engine.capabilities.instances == 3 and engine.instances() is None
    engine.load()
    try:
        report = engine.instances()
        assert report is not None and report.count == 3 and report.busy == (0, 0, 0)
        request = SynthesisRequest(text="Hello there.", voice=engine.default_voice)
        assert engine.synthesize(request).size > 5000
        assert engine.providers() == ("CPUExecutionProvider",)
    finally:
        engine.unload()
    assert engine.instances() is None
