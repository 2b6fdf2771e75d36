"""A cancel reaches into a running engine call: ONNX inferences stop at their next node through
`RunOptions.terminate`, eSpeak NG's synthesis at its next block of samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from engines.base import Cancelled, CancelToken, Engine, SynthesisRequest
from engines.espeak import EspeakEngine
from engines.hibari import HibariEngine
from engines.kokoro import KokoroEngine
from engines.onnx import RuntimeOptions
from engines.piper import PiperEngine
from tests.conftest import CACHE_DIR

LONG = ("The lighthouse keeper climbed the spiral stairs every evening, counting each step, "
        "listening to the wind, and wondering whether the ships far out at sea could see "
        "the small warm light he tended so carefully through the long cold night")


@pytest.fixture(scope="module", params=["kokoro", "piper", "hibari"])
def onnx_engine(request: pytest.FixtureRequest) -> Iterator[tuple[Engine, str]]:
    engine: Engine
    if request.param == "kokoro":
        engine, voice = KokoroEngine(CACHE_DIR, None, RuntimeOptions()), "jf_alpha"
    elif request.param == "hibari":
        engine, voice = HibariEngine(None, RuntimeOptions(), CACHE_DIR), "heart"
    else:
        engine = PiperEngine(None, RuntimeOptions())
        voice = engine.default_voice  # type: ignore[attr-defined]
    engine.load()
    yield engine, voice
    engine.unload()


def timed(engine: Engine, request: SynthesisRequest) -> float:
    started = time.perf_counter()
    list(engine.stream(request))
    return time.perf_counter() - started


def test_a_cancel_stops_a_running_inference(onnx_engine: tuple[Engine, str]) -> None:
    engine, voice = onnx_engine
    timed(engine, SynthesisRequest(text="Warm up.", voice=voice))  # first-run costs out of the way
    # One timing: noise only lengthens it, which moves the cancel later and loosens the bound.
    whole = timed(engine, SynthesisRequest(text=LONG, voice=voice))
    token = CancelToken()
    timer = threading.Timer(whole * 0.2, token.cancel)
    started = time.perf_counter()
    timer.start()
    with pytest.raises(Cancelled):
        list(engine.stream(SynthesisRequest(text=LONG, voice=voice, cancel=token)))
    stopped = time.perf_counter() - started
    # One inference of the whole text: without reaching into it, the call would run to its end.
    assert stopped < whole * 0.7, (stopped, whole)


def test_a_cancelled_request_never_starts(onnx_engine: tuple[Engine, str]) -> None:
    engine, voice = onnx_engine
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        list(engine.stream(SynthesisRequest(text="Hello there.", voice=voice, cancel=token)))
    # The session is fine afterwards: the next request speaks.
    assert len(next(engine.stream(SynthesisRequest(text="Hello there.", voice=voice)))) > 1000


def test_espeak_stops_when_cancelled() -> None:
    engine = EspeakEngine()
    engine.load()
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        engine.synthesize(SynthesisRequest(text=LONG * 20, voice="en-us", cancel=token))
    audio = engine.synthesize(SynthesisRequest(text=LONG, voice="en-us"))
    assert len(audio) / engine.sample_rate > 3


def test_cancel_token_hooks_run_once_and_late_hooks_at_once() -> None:
    token, calls = CancelToken(), []
    forget = token.on_cancel(lambda: calls.append("early"))
    gone = token.on_cancel(lambda: calls.append("forgotten"))
    gone()
    token.cancel()
    token.cancel()
    token.on_cancel(lambda: calls.append("late"))
    forget()
    assert calls == ["early", "late"] and token.cancelled and token.wait(0)
