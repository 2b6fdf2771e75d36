"""IPA onto each engine's phoneme set: the tested mapping per engine, and what it cannot say."""

from __future__ import annotations

import pytest

from engines.frontend import IPA, prepare_spanned
from engines.frontend.ipa import to_engine, unsayable


@pytest.mark.parametrize(("target", "expected"), [
    ("kokoro", "ˈtʃeɪndʒəɹ"),
    ("espeak-ipa", "ˈtʃeɪndʒəɹ"),
    ("espeak", "'tSeIndZ3"),
    ("misaki", "ˈʧAnʤəɹ"),
])
def test_one_reading_reaches_each_engine_in_its_own_symbols(target: str, expected: str) -> None:
    # Written the eSpeak way, misaki's way and with ASCII look-alikes: all the same reading.
    for written in ("ˈtʃeɪndʒɚ", "ˈʧAnʤɚ", "'tʃeɪndʒəɹ"):
        converted = to_engine(written, target)  # type: ignore[arg-type]
        assert converted.phonemes == expected, written
        assert converted.unknown == ()


def test_symbols_an_engine_has_no_sound_for_are_reported() -> None:
    assert to_engine("ʘa", "espeak").unknown == ("ʘ",)
    assert to_engine("ʘa", "kokoro").unknown == ("ʘ",)
    assert to_engine("ʘa", "espeak-ipa").unknown == ()  # Piper's ids include the clicks
    warnings = unsayable("a [click](/ʘa/) here", "kokoro")
    assert len(warnings) == 1 and "ʘ" in warnings[0] and "click" in warnings[0]


def test_inline_reading_is_a_run_of_its_own_spanning_the_word() -> None:
    text = "Say [Zyxqor](/zˈɪksɔɹ/) 42 times."
    runs = prepare_spanned(text, default="en-us")
    assert [r.language for r in runs] == ["en-us", IPA, "en-us"]
    ipa = runs[1].text
    assert ipa.text == "zˈɪksɔɹ"
    assert text[slice(*ipa.source_span(0, len(ipa)))] == "Zyxqor"
    assert "forty-two" in runs[2].text.text
