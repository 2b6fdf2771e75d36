"""The listening helper itself: word error rate arithmetic and an honest transcription."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.base import SynthesisRequest
from engines.espeak import EspeakEngine
from tests import hearing
from tests.hearing import hear, normalize, word_error_rate


def test_word_error_rate_counts_edits_over_the_reference() -> None:
    assert word_error_rate("Call me at 42.", "call me at forty two") == 0
    assert normalize("It's 9-5!") == ["it's", "nine", "five"]
    assert word_error_rate("one two three four", "one too three") == 0.5
    assert word_error_rate("a b", "") == 1.0


def test_silence_says_nothing_and_speech_is_heard() -> None:
    assert hear(np.zeros(16_000, np.float32), 16_000).text.strip(" .") == ""
    engine = EspeakEngine()
    engine.load()
    text = "Please open the door."
    audio = engine.synthesize(SynthesisRequest(text=text, voice="en-us"))
    heard = hear(audio, engine.sample_rate)
    assert word_error_rate(text, heard.text) <= 0.25, heard.text
    starts = [w.start for w in heard.words]
    assert starts == sorted(starts) and heard.words[-1].end <= len(audio) / engine.sample_rate + 0.5


def test_the_same_audio_is_always_heard_the_same() -> None:
    """Whisper samples at a higher temperature where greedy decoding looks poor (eSpeak NG reading
    a phone number does, depending on what it said before: its audio differs slightly from call to
    call); one such audio was heard three ways in four tries (word error rate 0.14 to 0.71). A
    log-probability threshold of 0 would make every decoding here fall back to sampling."""
    engine = EspeakEngine()
    engine.load()
    audio = engine.synthesize(SynthesisRequest(text="Please call (800) 555-0199 before Friday.",
                                               voice="en-us"))
    other = engine.synthesize(SynthesisRequest(text="Good morning.", voice="en-us"))
    heard = []
    for _ in range(4):
        heard.append(hear(audio, engine.sample_rate, log_prob_threshold=0.0).text)
        hear(other, engine.sample_rate, log_prob_threshold=0.0)  # sampling in between
    assert len(set(heard)) == 1, heard


def test_a_looping_transcript_is_decoded_again_and_heard_right(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """eSpeak NG reading a phone number digit by digit (as VoxMux hands it over), saved after it
    had read other phone numbers (its audio depends on what it said before), where greedy
    decoding loops: Whisper wrote 115 words for 14. Decoded again with the repetition penalty it
    is heard about right."""
    saved = np.load(Path(__file__).parent / "data" / "espeak_phone_loop.npz")
    audio, rate, text = saved["pcm"].astype(np.float32) / 32767, int(saved["rate"]), str(
        saved["text"])
    monkeypatch.setattr(hearing, "LOOP_RATIO", float("inf"))
    assert len(hear(audio, rate).text.split()) > 3 * len(text.split())  # the loop, as saved
    monkeypatch.undo()
    heard = hear(audio, rate).text
    assert len(heard.split()) <= len(text.split()) and word_error_rate(text, heard) <= 0.15, heard
