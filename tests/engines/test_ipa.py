"""IPA onto each engine's phoneme set: the tested mapping per engine, what it cannot say, and
stress marks moved from where dictionaries write them (before the syllable) to where eSpeak NG
and misaki write them (before the syllable's vowel), which is what the engines were trained on."""

from __future__ import annotations

import gzip
import json
import re
from importlib.resources import files

import pytest

from engines.espeak_lib import espeak
from engines.frontend import IPA, prepare_spanned
from engines.frontend.ipa import PhonemeSet, to_engine, unsayable

TARGETS: list[PhonemeSet] = ["kokoro", "espeak-ipa", "espeak", "misaki"]


@pytest.mark.parametrize(("target", "expected"), [
    ("kokoro", "tʃˈeɪndʒəɹ"),
    ("espeak-ipa", "tʃˈeɪndʒəɹ"),
    ("espeak", "tS'eIndZ3"),
    ("misaki", "ʧˈAnʤəɹ"),
])
def test_one_reading_reaches_each_engine_in_its_own_symbols(target: PhonemeSet,
                                                            expected: str) -> None:
    # Written the eSpeak way, misaki's way, with ASCII look-alikes and the stress mark where a
    # dictionary puts it: all the same reading.
    for written in ("tʃˈeɪndʒɚ", "ʧˈAnʤɚ", "'tʃeɪndʒəɹ", "ˈtʃeɪndʒɚ"):
        converted = to_engine(written, target)
        assert converted.phonemes == expected, written
        assert converted.unknown == ()


# (word, as a dictionary writes it, as eSpeak NG and misaki write it): US English, `ɹ` for r.
DICTIONARY = [
    ("banana", "bəˈnænə", "bənˈænə"),
    ("tomato", "təˈmeɪtoʊ", "təmˈeɪtoʊ"),  # a diphthong is one nucleus
    ("potato", "pəˈteɪtoʊ", "pətˈeɪtoʊ"),
    ("computer", "kəmˈpjuːtəɹ", "kəmpjˈuːtəɹ"),  # the glide is onset; length stays on its vowel
    ("strange", "ˈstɹeɪndʒ", "stɹˈeɪndʒ"),  # three onset consonants
    ("sculpture", "ˈskʌlptʃəɹ", "skˈʌlptʃəɹ"),
    ("chocolate", "ˈtʃɑːklət", "tʃˈɑːklət"),  # an affricate onset
    ("umbrella", "ʌmˈbɹɛlə", "ʌmbɹˈɛlə"),
    ("understand", "ˌʌndəɹˈstænd", "ˌʌndəɹstˈænd"),  # a secondary before its vowel stays
    ("pronunciation", "pɹəˌnʌnsiˈeɪʃən", "pɹənˌʌnsiˈeɪʃən"),  # a primary before it stays
    ("university", "ˌjuːnɪˈvɜːsɪti", "jˌuːnɪvˈɜːsɪti"),
    ("extraordinary", "ɪkˈstɹɔːɹdənˌɛɹi", "ɪkstɹˈɔːɹdənˌɛɹi"),
    ("beautiful", "ˈbjuːtɪfəl", "bjˈuːtɪfəl"),
    ("birthday", "ˈbɜːɹθˌdeɪ", "bˈɜːɹθdˌeɪ"),  # an r-coloured vowel is one nucleus
    ("elephant", "ˈɛlɪfənt", "ˈɛlɪfənt"),  # already before its vowel: nothing moves
    ("button", "ˈbʌtn̩", "bˈʌtn̩"),  # a syllabic consonant is a nucleus, not an onset
    ("photography", "fəˈtɑːɡɹəfi", "fətˈɑːɡɹəfi"),
]


@pytest.mark.parametrize(("word", "standard", "own"), DICTIONARY)
def test_dictionary_stress_reaches_every_engine_before_the_vowel(word: str, standard: str,
                                                                 own: str) -> None:
    assert to_engine(standard, "espeak-ipa").phonemes == own, word
    assert to_engine(own, "espeak-ipa").phonemes == own, word  # its own convention: as it is
    for target in TARGETS:
        assert to_engine(standard, target) == to_engine(own, target), (word, target)


@pytest.mark.parametrize(("standard", "target", "expected"), [
    ("bəˈnænə", "espeak", "b@n'an@"),
    ("ˈstɹeɪndʒ", "espeak", "str'eIndZ"),
    ("ˌʌndəɹˈstænd", "espeak", ",Vnd3st'and"),
    ("ˈstɹeɪndʒ", "misaki", "stɹˈAnʤ"),
    ("təˈmeɪtoʊ", "misaki", "təmˈAtO"),
    ("ˈstɹeɪndʒ", "kokoro", "stɹˈeɪndʒ"),
    ("təˈmAɾO", "kokoro", "təmˈeɪɾoʊ"),  # misaki's letters, the mark before the onset
])
def test_each_phoneme_set_gets_the_mark_before_the_vowel(standard: str, target: PhonemeSet,
                                                         expected: str) -> None:
    assert to_engine(standard, target).phonemes == expected


@pytest.mark.parametrize(("written", "expected"), [
    ("ˈpr̩st", "pˈr̩st"),  # Czech "prst": the syllabic r is the nucleus
    ("ˈbi̯en", "bi̯ˈen"),  # a non-syllabic vowel is a glide of the onset
    ("ˈkʰæt", "kʰˈæt"),  # a modifier letter belongs to its consonant
    ("ˈpst", "ˈpst"),  # no nucleus: left where the client put it
    ("ˈtʃeɪn ˈɡæŋ", "tʃˈeɪn ɡˈæŋ"),  # each word on its own
    ("ˈst ɑː", "ˈst ɑː"),  # a mark never crosses a word
    ("ˈsˌæt", "ˈsˌæt"),  # nor another mark
    ("ˈmɛ̃", "mˈɛ̃"),  # a vowel with a diacritic is still a vowel
])
def test_syllabification_edge_cases(written: str, expected: str) -> None:
    assert to_engine(written, "espeak-ipa", english=False).phonemes == expected


def _stresses(phonemes: str) -> list[str]:
    """Each stress mark with the symbol after it."""
    return re.findall("[ˈˌ].", phonemes)


SAMPLE = ["banana", "tomato", "potato", "computer", "strange", "chocolate", "hotel", "about",
          "elephant", "important", "water", "hello", "button", "little", "beautiful",
          "university", "pronunciation", "extraordinary", "particular", "understand",
          "education", "sculpture", "information", "photograph", "photography", "telephone",
          "guitar", "police", "return", "birthday", "garage", "umbrella", "dictionary",
          "television"]


def test_ipa_already_in_the_engines_convention_keeps_its_marks() -> None:
    """eSpeak NG's own IPA (Piper's, Kokoro's English) and misaki's lexicon (hibari's): no
    stress mark of theirs moves, whatever their vowels (`ᵻ`, `ɚ`, misaki's letters)."""
    for word in SAMPLE:
        own = espeak().phonemize(word, "en-us")
        targets: list[PhonemeSet] = ["espeak-ipa", "kokoro"]
        for target in targets:
            phonemes = to_engine(own, target).phonemes
            assert _stresses(phonemes) == _stresses(own), (word, target, own)
    gold = files("hibari") / "assets" / "lexicon_us_gold.json.gz"
    lexicon = json.loads(gzip.decompress(gold.read_bytes()))
    for word in SAMPLE:
        entry = lexicon.get(word)
        for reading in ([entry] if isinstance(entry, str) else (entry or {}).values()):
            if reading:
                phonemes = to_engine(reading, "misaki").phonemes
                assert _stresses(phonemes) == _stresses(reading), (word, reading, phonemes)


def test_reduced_vowels_reach_each_engine() -> None:
    """eSpeak NG's `ᵻ` (return: ɹᵻtˈɜːn) is a mnemonic of its own; misaki writes `ə` where
    eSpeak NG writes `ɐ` in a word (banana: bɐnˈænə), and a dropped vowel is another word."""
    converted = to_engine("ɹᵻtˈɜːn", "espeak")
    assert (converted.phonemes, converted.unknown) == ("rI#t'3:n", ())
    assert to_engine("bɐnˈænə", "misaki").phonemes == "bənˈænə"


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
