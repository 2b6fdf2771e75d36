"""Pronunciation through the API, as a client uses it: SSML on the speech routes, breaks
measured in the audio, say-as heard by Whisper, timings that point into the SSML, lexicons
(deployment file and a key's own, PLS too) that change how a made-up word is heard and the
cache key, the normalization report."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engines.espeak_lib import espeak
from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.hearing import Heard, hear, hear_many, normalize, word_error_rate

WORD = "chocolate"
IPA = espeak().phonemize(WORD, "en-us")


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("pronunciation")
    lexicon = tmp / "lexicon.toml"
    lexicon.write_text(f'[en]\nBlorvek = "/{IPA}/"\n', encoding="utf-8")
    server = start_server(test_settings(tmp, preload=[], idle_ttl=-1, lexicon=lexicon,
                                        lexicons_dir=tmp / "lexicons"))
    yield server
    server.stop()


def _speak(live: LiveServer, model: str, text: str, **extra: object) -> tuple[object, object]:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": model, "input": text, "response_format": "wav", **extra})
    assert response.status_code == 200, response.text
    return decode(response.content, "wav"), response


def _silences(samples: np.ndarray, rate: int) -> list[float]:
    """Lengths of the silent runs inside the audio (5 ms blocks under RMS 0.003)."""
    block = round(rate * 0.005)
    count = len(samples) // block
    rms = np.sqrt(np.mean(np.square(samples[:count * block].reshape(count, block)), axis=1))
    loud = np.flatnonzero(rms >= 0.003)
    quiet = [b - a - 1 for a, b in itertools.pairwise(loud) if b - a > 1]
    return [n * block / rate for n in quiet]


def test_malformed_ssml_is_a_400_naming_line_and_column(live: LiveServer) -> None:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": "espeak", "input": "<speak>Hello\n<break time='1s'>there</speak>"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "input"
    assert error["code"] == "invalid_ssml"
    assert "line 2, column" in error["message"]


@pytest.mark.parametrize("model", ["espeak", "piper", "kokoro", "hibari"])
def test_a_break_is_that_long_in_the_audio(live: LiveServer, model: str) -> None:
    audio, _ = _speak(live, model, '<speak>Good morning.<break time="700ms"/>'
                      'Good night.</speak>')
    longest = max(_silences(audio.samples, audio.sample_rate))  # type: ignore[attr-defined]
    assert abs(longest - 0.7) <= 0.02, longest
    audio, _ = _speak(live, model, '<speak>Good morning.<break time="1500ms"/>'
                      'Good night.</speak>')
    longest = max(_silences(audio.samples, audio.sample_rate))  # type: ignore[attr-defined]
    assert abs(longest - 1.5) <= 0.02, longest


_DIGIT_WORDS = {w: str(i) for i, w in enumerate(
    ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"])} | {"oh": "0"}


def _digits(heard: str) -> str:
    out = []
    for token in re.findall(r"[a-z]+|\d", heard.lower()):
        out.append(_DIGIT_WORDS.get(token, token if token.isdigit() else ""))
    return "".join(out)


def _spelled(heard: str) -> bool:
    """Letters as Whisper writes them: `DOG`, `D-O-G`, `d -o -g` (the word: `dog`)."""
    return bool(re.search(r"\bD\W*O\W*G\b", heard)
                or re.search(r"\bd\W+o\W+g\b", heard, re.I))


def test_say_as_telephone_and_characters_are_heard_as_asked(live: LiveServer) -> None:
    said = [_speak(live, "piper", text)[0] for text in (
        "The code is dog.",
        '<speak>Call <say-as interpret-as="telephone">5550199</say-as> today.</speak>',
        '<speak>The code is <say-as interpret-as="characters">dog</say-as>.</speak>')]
    # One Whisper pass, the plain reading first: nothing before it to read on from.
    plain, heard, spelled = (h.text for h in hear_many(
        [(a.samples, a.sample_rate) for a in said]))  # type: ignore[attr-defined]
    # Digit by digit, one slip allowed: Piper samples its durations, and Whisper once heard
    # "550-199" (one "five" fewer) in a full suite; a number read as one ("five million ...")
    # or words lost fail by far more.
    assert word_error_rate(" ".join("5550199"), " ".join(_digits(heard))) <= 1 / 7, heard
    assert _spelled(spelled), spelled
    assert not _spelled(plain), plain


def test_timings_of_an_ssml_request_point_into_the_ssml(live: LiveServer) -> None:
    ssml = ('<speak><p>The <sub alias="World Wide Web Consortium">W3C</sub> met on '
            '<say-as interpret-as="date" format="ymd">2024-03-05</say-as>.</p>'
            '<break time="300ms"/><s>Then <phoneme alphabet="ipa" ph="təˈmɑːtoʊ">tomato'
            '</phoneme> soup.</s></speak>')
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": "espeak", "input": ssml, "stream_format": "sse", "timestamps": "word",
            "normalization_report": True})
    assert response.status_code == 200, response.text
    words = [w for line in response.text.splitlines() if line.startswith("data: ")
             for w in json.loads(line[6:]).get("words", [])]
    said = [(w["word"], ssml[w["char_start"]:w["char_end"]]) for w in words]
    assert all(word == written for word, written in said), said
    assert [w for w, _ in said] == ["The", "W3C", "met", "on", "2024-03-05", "Then",
                                    "tomato", "soup"]
    report = json.loads(response.headers["X-VoxMux-Normalization"])
    assert {(r["text"], r["by"]) for r in report} == {
        ("W3C", "sub"), ("2024-03-05", "say-as:date"), ("tomato", "phoneme")}
    assert next(r for r in report if r["by"] == "sub")["read_as"] == "World Wide Web Consortium"


def test_captions_of_ssml_quote_the_text_without_its_markup(live: LiveServer) -> None:
    ssml = ('<speak>The <sub alias="World Wide Web Consortium">W3C</sub> met.'
            '<break time="500ms"/> Then it rained.</speak>')
    with live.client() as client:
        response = client.post("/v1/audio/captioned_speech", json={
            "model": "espeak", "input": ssml, "stream": False, "captions": "vtt",
            "response_format": "wav"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [w["word"] for w in body["timestamps"]] == ["The", "W3C", "met", "Then", "it",
                                                       "rained"]
    captions = body["captions"]
    assert "W3C met." in captions and "Then it rained." in captions and "<" not in captions


def test_the_native_route_reads_ssml_too(live: LiveServer) -> None:
    with live.client() as client:
        response = client.post("/v1/synth", json={
            "model": "espeak", "input": '<speak>Good morning.<break time="1s"/>Good night.'
                                        '</speak>'})
    assert response.status_code == 200, response.text
    audio = decode(response.content, "wav")
    assert abs(max(_silences(audio.samples, audio.sample_rate)) - 1.0) <= 0.02


def test_the_websocket_route_reads_ssml_and_sends_words_in_it(live: LiveServer) -> None:
    from websockets.sync.client import connect

    ssml = '<speak>Say <sub alias="hello">hi</sub>.<break time="400ms"/> Bye.</speak>'
    with connect(live.url.replace("http", "ws") + "/ws/v1/tts") as ws:
        ws.send(json.dumps({"model": "espeak", "input": ssml, "timestamps": "word"}))
        frames = []
        while True:
            frame = ws.recv()
            if isinstance(frame, str):
                frames.append(json.loads(frame))
                if frames[-1]["type"] in ("done", "error"):
                    break
    assert frames[-1]["type"] == "done", frames[-1]
    words = [w for f in frames if f["type"] == "words" for w in f["words"]]
    assert [(w["word"], ssml[w["char_start"]:w["char_end"]]) for w in words] == [
        ("Say", "Say"), ("hi", "hi"), ("Bye", "Bye")]


def test_unsupported_markup_is_read_with_a_warning(live: LiveServer) -> None:
    audio, response = _speak(live, "espeak", '<speak><emphasis>Really</emphasis> '
                             '<audio src="x.wav">a bell</audio> [click](/ʘa/).</speak>')
    warnings = response.headers["X-VoxMux-Warnings"]  # type: ignore[attr-defined]
    assert "<emphasis>" in warnings and "<audio>" in warnings and "click" in warnings
    assert audio.duration > 0.5  # type: ignore[attr-defined]


def _match(signal: np.ndarray, clip: np.ndarray) -> tuple[float, int]:
    """The best normalized cross-correlation of `clip` inside `signal`, and where it is."""
    n = len(signal) + len(clip)
    size = 1 << (n - 1).bit_length()
    dots = np.fft.irfft(np.fft.rfft(signal, size) * np.conj(np.fft.rfft(clip, size)), size)
    dots = dots[:len(signal) - len(clip) + 1]
    energy = np.concatenate([[0.0], np.cumsum(np.square(signal, dtype=np.float64))])
    windows = np.sqrt(np.maximum(energy[len(clip):] - energy[:-len(clip)], 1e-12))
    scores = dots / (windows * np.linalg.norm(clip))
    best = int(np.argmax(scores))
    return float(scores[best]), best


def test_ssml_voice_switching_joins_two_models_at_the_requests_rate(live: LiveServer) -> None:
    """hibari (24 kHz) reads the request, eSpeak NG (22,050 Hz) the middle sentence: that part
    is eSpeak NG's own audio of it, brought to 24 kHz (a wrong rate would stretch it 9 % and
    the match would fail), and the words' times and spans run on across both."""
    import soxr

    middle = "The weather is cold today."
    ssml = (f'<speak>Good morning, my friend. <voice name="espeak:en-us">{middle}</voice> '
            'Good night.</speak>')
    audio, response = _speak(live, "hibari", ssml)
    samples, rate = audio.samples, audio.sample_rate  # type: ignore[attr-defined]
    assert rate == 24000 and "X-VoxMux-Warnings" not in response.headers  # type: ignore
    heard = normalize(hear(samples, rate).text)
    assert {"morning", "weather", "cold", "night"} <= set(heard), heard
    alone, _ = _speak(live, "espeak", middle, voice="en-us")
    espeak = soxr.resample(alone.samples, alone.sample_rate, rate)  # type: ignore[attr-defined]
    score, at = _match(samples, espeak)
    assert score > 0.95, score
    hibari_alone, _ = _speak(live, "hibari", middle)
    assert _match(samples, hibari_alone.samples)[0] < 0.6  # type: ignore[attr-defined]

    with live.client() as client:
        timed = client.post("/v1/audio/speech", json={
            "model": "hibari", "input": ssml, "stream_format": "sse", "timestamps": "word"})
    assert timed.status_code == 200, timed.text
    words = [w for line in timed.text.splitlines() if line.startswith("data: ")
             for w in json.loads(line[6:]).get("words", [])]
    assert [ssml[w["char_start"]:w["char_end"]] for w in words] == [w["word"] for w in words]
    assert [w["word"] for w in words] == ["Good", "morning", "my", "friend", "The", "weather",
                                         "is", "cold", "today", "Good", "night"]
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    assert abs(words[4]["start"] - at / rate) < 0.15  # "The" where eSpeak NG's audio starts


def test_ssml_voice_names_a_voice_a_model_or_model_voice(live: LiveServer) -> None:
    """`<voice name>` resolves like the request's voice first, then as a model, then
    model:voice; an unknown one is a 400 naming it; the cache tells the voices apart."""
    text = '<speak>Hello there. <voice name="{}">How are you?</voice></speak>'
    for name in ("piper", "jf_alpha", "espeak:en-us", "espeak:en-gb"):
        _, response = _speak(live, "hibari", text.format(name))
        assert "X-VoxMux-Warnings" not in response.headers, name  # type: ignore[attr-defined]
        assert response.headers["X-VoxMux-Cache"] == "miss", name  # type: ignore[attr-defined]
    _, again = _speak(live, "hibari", text.format("espeak:en-gb"))
    assert again.headers["X-VoxMux-Cache"] == "hit"  # type: ignore[attr-defined]
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": "hibari", "input": text.format("nobody")})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "voice_not_found" and error["param"] == "input"
    assert "nobody" in error["message"]


def test_ssml_lang_reads_a_stretch_in_another_language(live: LiveServer) -> None:
    french = "Bonjour, mon ami."
    ssml = f'<speak>Hello. <lang xml:lang="fr-FR">{french}</lang></speak>'
    audio, response = _speak(live, "espeak", ssml, voice="en-us")
    assert "X-VoxMux-Warnings" not in response.headers  # type: ignore[attr-defined]
    samples = audio.samples  # type: ignore[attr-defined]
    as_french, _ = _speak(live, "espeak", french, voice="en-us", language="fr-fr")
    as_english, _ = _speak(live, "espeak", french, voice="en-us")
    assert _match(samples, as_french.samples)[0] > 0.95  # type: ignore[attr-defined]
    assert _match(samples, as_english.samples)[0] < 0.6  # type: ignore[attr-defined]
    _, response = _speak(live, "hibari", ssml)  # English only: read anyway, and said so
    assert "not read by the hibari engine" in response.headers["X-VoxMux-Warnings"]  # type: ignore


def _pitch(samples: np.ndarray, rate: int) -> float:
    """Median F0 of the voiced 40 ms frames (autocorrelation, 60-400 Hz)."""
    frame, hop = round(rate * 0.04), round(rate * 0.02)
    low, high = rate // 400, rate // 60
    frames = [samples[i:i + frame] for i in range(0, len(samples) - frame, hop)]
    loudest = max(float(np.sqrt(np.mean(np.square(f)))) for f in frames)
    found = []
    for f in frames:
        if np.sqrt(np.mean(np.square(f))) < 0.2 * loudest:
            continue
        x = f - f.mean()
        ac = np.correlate(x, x, "full")[frame - 1:]
        lag = low + int(np.argmax(ac[low:high]))
        if ac[lag] > 0.5 * ac[0]:
            found.append(rate / lag)
    return float(np.median(found))


# Measured here: 1.247 (+25 %), 1.299 (+4 semitones, 1.26 asked), 0.764 (x-low, 0.75 asked).
@pytest.mark.parametrize(("model", "pitch", "low", "high"), [
    ("hibari", "+25%", 1.15, 1.35), ("piper", "+4st", 1.15, 1.4), ("espeak", "x-low", 0.65, 0.85),
])
def test_prosody_pitch_moves_the_voice_and_keeps_its_tempo(live: LiveServer, model: str,
                                                           pitch: str, low: float,
                                                           high: float) -> None:
    sentence = "The weather is cold today, and the wind is strong."
    plain, _ = _speak(live, model, f"<speak>{sentence}</speak>")
    moved, response = _speak(live, model, f'<speak><prosody pitch="{pitch}">{sentence}'
                             '</prosody></speak>')
    assert "X-VoxMux-Warnings" not in response.headers  # type: ignore[attr-defined]
    rate = plain.sample_rate  # type: ignore[attr-defined]
    ratio = _pitch(moved.samples, rate) / _pitch(plain.samples, rate)  # type: ignore
    assert low <= ratio <= high, ratio
    duration = moved.duration / plain.duration  # type: ignore[attr-defined]
    assert 0.95 <= duration <= 1.05, duration
    # one Whisper pass, the moved voice first: the plain one may read on from it, not it from
    # the plain one
    errors = [word_error_rate(sentence, h.text) for h in hear_many(
        [(a.samples, rate) for a in (moved, plain)])]  # type: ignore[attr-defined]
    assert errors[0] <= errors[1] + 0.2, errors  # heard about as well as the voice's own


def _heard(live: LiveServer, text: str, **extra: object) -> tuple[str, object]:
    audio, response = _speak(live, "piper", text, **extra)
    heard = " ".join(normalize(hear(audio.samples, audio.sample_rate).text))  # type: ignore
    return heard, response


def _words(heard: Heard) -> str:
    return " ".join(normalize(heard.text))


def test_the_deployment_lexicon_changes_how_a_made_up_word_is_heard(live: LiveServer) -> None:
    heard, response = _heard(live, "I would like Blorvek cake.", normalization_report=True)
    assert WORD in heard, heard
    report = json.loads(response.headers["X-VoxMux-Normalization"])  # type: ignore
    assert report == [{"start": 13, "end": 20, "text": "Blorvek", "read_as": f"/{IPA}/",
                       "by": "lexicon"}]


def test_a_keys_lexicon_is_managed_applied_and_keys_the_cache(live: LiveServer) -> None:
    """Each reading is said as the lexicons stand then; all four are heard in one Whisper pass
    at the end."""
    text = "I would like Snarfle cake."
    before, first = _speak(live, "piper", text)
    with live.client() as client:
        made = client.post("/v1/audio/lexicons", json={
            "name": "desserts", "entries": {"Snarfle": f"/{IPA}/"}})
        assert made.status_code == 201, made.text
        assert client.get("/v1/audio/lexicons").json()["data"][0]["name"] == "desserts"
    after, second = _speak(live, "piper", text)
    assert second.headers["X-VoxMux-Cache"] == "miss"  # type: ignore[attr-defined]
    with live.client() as client:
        pls = ('<?xml version="1.0"?><lexicon version="1.0" '
               'xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" '
               'xml:lang="en-US"><lexeme><grapheme>Snarfle</grapheme><alias>vanilla</alias>'
               '</lexeme></lexicon>')
        imported = client.post("/v1/audio/lexicons?name=desserts", content=pls,
                               headers={"Content-Type": "application/pls+xml"})
        assert imported.status_code == 201, imported.text
        assert imported.json()["entries"] == {"Snarfle": "vanilla"}
    aliased, _ = _speak(live, "piper", text)
    with live.client() as client:
        assert client.delete("/v1/audio/lexicons/desserts").status_code == 200
        missing = client.get("/v1/audio/lexicons/desserts")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == (
            "lexicon_not_found")
    again, third = _speak(live, "piper", text)
    assert third.headers["X-VoxMux-Cache"] == "hit"  # type: ignore[attr-defined]
    # the two readings without a lexicon first: nothing of the word or alias before them in
    # the pass for Whisper to read on from
    heard = [_words(h) for h in hear_many([(a.samples, a.sample_rate)  # type: ignore
                                           for a in (before, again, after, aliased)])]
    assert WORD not in heard[0], heard
    assert WORD not in heard[1] and "vanilla" not in heard[1], heard
    assert WORD in heard[2], heard
    assert "vanilla" in heard[3], heard
    del first


def test_bad_lexicons_are_refused(live: LiveServer, tmp_path: Path) -> None:
    with live.client() as client:
        bad = client.post("/v1/audio/lexicons", content="<lexicon><lexeme>",
                          headers={"Content-Type": "application/pls+xml"},
                          params={"name": "x"})
        assert bad.status_code == 400 and "line 1" in bad.json()["error"]["message"]
        bad = client.post("/v1/audio/lexicons", json={"name": "../x", "entries": {"a": "b"}})
        assert bad.status_code == 400
        bad = client.put("/v1/audio/lexicons/x", json={"entries": {"a](": "b"}})
        assert bad.status_code == 400


def _edges(samples: np.ndarray, rate: int) -> tuple[float, float]:
    """Seconds of silence before the first and after the last sound (5 ms blocks)."""
    block = round(rate * 0.005)
    count = len(samples) // block
    rms = np.sqrt(np.mean(np.square(samples[:count * block].reshape(count, block)), axis=1))
    loud = np.flatnonzero(rms >= 0.003)
    return loud[0] * block / rate, (len(samples) - (loud[-1] + 1) * block) / rate


@pytest.mark.parametrize("model", ["espeak", "piper"])
def test_breaks_before_and_after_the_text_are_in_the_audio(live: LiveServer, model: str) -> None:
    """A break before the first words or after the last is heard as its length (both used to be
    dropped: the audio was as long as the text alone)."""
    plain, _ = _speak(live, model, "Hello there.")
    lead, _ = _speak(live, model, '<speak><break time="3s"/>Hello there.</speak>')
    trail, _ = _speak(live, model, '<speak>Hello there.<break time="2s"/></speak>')
    rate = plain.sample_rate  # type: ignore[attr-defined]
    before, _ = _edges(lead.samples, rate)  # type: ignore[attr-defined]
    _, after = _edges(trail.samples, rate)  # type: ignore[attr-defined]
    assert abs(before - 3.0) <= 0.02, before
    assert abs(after - 2.0) <= 0.02, after
    assert lead.duration - plain.duration > 2.8  # type: ignore[attr-defined]
