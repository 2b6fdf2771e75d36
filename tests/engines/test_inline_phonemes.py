"""`[word](/ipa/)` on every engine, heard by Whisper: the word is said as its IPA says, and the
word's timing spans the word, not the markup."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from engines.base import SynthesisRequest, TimedAudio
from engines.espeak import EspeakEngine
from engines.espeak_lib import espeak
from engines.hibari import HibariEngine
from engines.kokoro import KokoroEngine
from engines.onnx import RuntimeOptions
from engines.piper import PiperEngine
from tests.conftest import CACHE_DIR
from tests.hearing import hear_many, normalize

WORD = "chocolate"
MADE_UP = f"Please buy [Zyxqor](/{espeak().phonemize(WORD, 'en-us')}/) today."
"""The made-up word read as eSpeak NG reads "chocolate": compared with the engine saying the
word itself."""


@pytest.fixture(scope="module", params=["kokoro", "piper", "espeak", "hibari"])
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[object, str]]:
    if request.param == "kokoro":
        made: object = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
        voice = "jf_alpha"
    elif request.param == "piper":
        made = PiperEngine(None, RuntimeOptions(), CACHE_DIR)
        voice = ""
    elif request.param == "hibari":
        made = HibariEngine(None, RuntimeOptions(), CACHE_DIR)
        voice = "heart"
    else:
        made = EspeakEngine()
        voice = "en-us"
    made.load()  # type: ignore[attr-defined]
    yield made, voice or made.default_voice  # type: ignore[attr-defined]
    made.unload()  # type: ignore[attr-defined]


def _say(engine: object, voice: str, text: str, timings: bool = False) -> TimedAudio:
    chunks = list(engine.stream_timed(  # type: ignore[attr-defined]
        SynthesisRequest(text=text, voice=voice, timings=timings)))
    return TimedAudio(np.concatenate([c.audio for c in chunks]),
                      tuple(w for c in chunks for w in c.words))


def test_inline_ipa_is_heard_as_written(engine: tuple[object, str]) -> None:
    made, voice = engine
    rate = made.sample_rate  # type: ignore[attr-defined]
    said = _say(made, voice, MADE_UP, timings=True)
    # one Whisper pass, the word itself last: nothing before the made-up word's reading that
    # Whisper could read "chocolate" on from
    plain, heard, raw = (" ".join(normalize(h.text)) for h in hear_many([
        (_say(made, voice, "Please buy Zyxqor today.").audio, rate), (said.audio, rate),
        (_say(made, voice, f"Please buy {WORD} today.").audio, rate)]))
    assert WORD not in plain
    assert WORD in raw, raw  # the engine can say it at all
    assert WORD in heard, heard
    assert "zyxqor" not in heard and "ipa" not in heard
    spans = {w.word: (w.char_start, w.char_end) for w in said.words}
    assert "Zyxqor" in spans, spans
    start, end = spans["Zyxqor"]
    assert MADE_UP[start:end] == "Zyxqor"
