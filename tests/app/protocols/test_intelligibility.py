"""A listener hears what was written: sentences with numbers and phone numbers, served through
OpenAI's route as 24 kHz pcm (as voice agents play it), are transcribed by Whisper about as well
as the same engine's own output for the same sentences, called in-process with nothing of
VoxMux's serving around it (no splitting, trimming, joining, resampling or encoding)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from engines.base import SynthesisRequest
from tests.conftest import LiveServer, decode
from tests.hearing import hear, hear_many, word_error_rate

SENTENCES = [
    "The meeting starts at 3:30 pm in room 12.",
    "Please call (800) 555-0199 before Friday.",
    "The package weighs 2.5 kilograms and costs $19.99.",
    "She moved to Boston in 1995 with her two brothers.",
    "Call +1 800 555 0199 today.",
]
VOICES = {"piper": "en_US-joe-medium", "kokoro": "jf_alpha", "espeak": "en-us"}
_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def digitwise(text: str) -> str:
    """Digits as separate words, so `800-555-0199` and `800 5550199` (Whisper writes phone
    numbers either way) count the same digits heard in the same order."""
    return re.sub(r"\d", lambda m: f" {_DIGITS[int(m[0])]} ", text)


def wer(reference: str, audio: np.ndarray, rate: int) -> float:
    return word_error_rate(digitwise(reference), digitwise(hear(audio, rate).text))


def wers(references: list[str], clips: list[tuple[np.ndarray, int]]) -> list[float]:
    """Each clip's word error rate, digit by digit, all heard in one Whisper pass."""
    return [word_error_rate(digitwise(reference), digitwise(heard.text))
            for reference, heard in zip(references, hear_many(clips), strict=True)]


@pytest.mark.parametrize("model", list(VOICES))
def test_served_speech_is_heard_as_well_as_the_raw_engine(server: LiveServer, model: str) -> None:
    # Kokoro renders at about 2.5x real time here: three of the five sentences for it (the
    # time, the phone number and the amount), the suite's time.
    sentences = SENTENCES[:3] if model == "kokoro" else SENTENCES
    served_audio, raw_audio = [], []
    with server.client() as http:
        for sentence in sentences:
            response = http.post("/v1/audio/speech", json={
                "model": model, "input": sentence, "voice": VOICES[model],
                "response_format": "pcm"})
            assert response.status_code == 200, response.text
            audio = decode(response.content, "pcm", pcm_rate=24000)
            served_audio.append((audio.samples, 24000))
    engine = server.app.state.service.registry[model].engine  # loaded by the requests above
    for sentence in sentences:
        audio = engine.synthesize(SynthesisRequest(text=sentence, voice=VOICES[model]))
        raw_audio.append((audio, engine.sample_rate))
    # served and raw in passes of their own: each sentence read on from the same sentences
    served, raw = wers(sentences, served_audio), wers(sentences, raw_audio)
    report = {"served": [round(x, 2) for x in served], "raw": [round(x, 2) for x in raw]}
    # Medians: Whisper now and then hallucinates a run of digits on one robotic sentence (served
    # or raw alike); a fault in serving (wrong rate, clicks, cut words) spoils most of them.
    # eSpeak NG's audio for one text differs slightly from call to call (its state runs on from
    # one utterance to the next), and Whisper hears its phone numbers differently for it: once
    # in five full-suite runs (when Whisper still sampled) its served sentences came out 0.17 to
    # raw's 0.0. The margin is 0.2, which a wrong rate or cut words (WER near 1) fail by far.
    assert np.median(served) <= np.median(raw) + 0.2, report
    assert np.median(served) <= 0.25 and np.mean(served) <= 0.5, report
