"""IPA as each engine's phoneme set: what a client writes (`[word](/ipa/)`, an SSML `phoneme`, a
lexicon entry) reaches Kokoro, Piper, hibari and eSpeak NG in the symbols each one reads.

A client's IPA may be written the eSpeak way (`eɪ`, `dʒ`) or misaki's (`A`, `ʤ`), with ASCII
look-alikes (`r`, `g`); `to_engine` folds those, maps the result onto the engine's set and names
the symbols the engine has no sound for (reported to the client, never dropped silently).

Dictionaries, and the W3C, Azure and Polly SSML examples, put a stress mark before the stressed
syllable (`bəˈnænə`); eSpeak NG and misaki put it before the syllable's vowel (`bənˈænə`), and
Piper's voices, Kokoro and hibari were trained on their output: Piper heard `bəˈnænə` as "Abe
and Anna". Each mark is moved past the onset consonants after it, to its nucleus; IPA written
the engines' way has no onset between a mark and its vowel, so it is left as it is.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Literal

PhonemeSet = Literal["kokoro", "espeak-ipa", "espeak", "misaki"]
"""Kokoro's vocabulary (eSpeak IPA and misaki's letters), eSpeak NG's IPA output (Piper's
phoneme ids), eSpeak NG's own phoneme mnemonics (its `[[...]]` input), misaki's IPA (hibari)."""

INLINE = re.compile(r"\[(?P<word>[^\[\]\n]+)\]\(/(?P<ipa>[^/()\n]+)/\)")
"""`[word](/ipa/)`, as Kokoro's own front end (misaki) writes a word with a given reading."""

_COMMON = {"\u0361": "", "\u035c": "", "g": "ɡ", "ɝ": "ɜɹ", "ɫ": "l", "'": "ˈ", ",": "ˌ",
           ":": "ː", "ʧ": "tʃ", "ʤ": "dʒ", "ᵊ": "ə", "ɚ": "əɹ", ".": ""}
"""Look-alikes and ligatures folded before mapping (ASCII stress marks, tie bars)."""

_STRESS = frozenset("ˈˌ")

_VOWELS = frozenset("aeiouyæøœɐɑɒɔɘəɚɛɜɝɞɤɨɪɯɵɶʉʊʌʏᵻᵊ")
"""IPA's vowel letters, eSpeak NG's `ᵻ` and misaki's `ᵊ`: what a nucleus begins with."""

_SYLLABIC = frozenset("\u0329\u030d")
"""Marks that make a consonant a nucleus (`n̩` in button)."""

_NON_SYLLABIC = frozenset("\u032f\u0311")
"""Marks that make a vowel a glide of the onset (`i̯`)."""

_MISAKI_LETTERS = {"A": "eɪ", "I": "aɪ", "O": "oʊ", "Q": "əʊ", "W": "aʊ", "Y": "ɔɪ"}

_KOKORO = frozenset(
    " !\"(),.:;?AIOQSTWYabcdefhijklmnopqrstuvwxyzæçðøŋœɐɑɒɔɕɖəɚɛɜɟɡɣɤɥɨɪɯɰɲɳɴɸɹɻɽɾʁʂʃʈʊʋʌʎʒʔʝ"
    "ʣʤʥʦʧʨʰʲˈˌː̃βθχᵊᵝᵻ—“”…")
"""Kokoro v1.0's vocabulary (`vocab.json` of the voice package), punctuation included."""

_ESPEAK_IPA = frozenset(
    " !\"#$'(),-.0123456789:;?^_abcdefhijklmnopqrstuvwxyzæçðøħŋœǀǁǂǃɐɑɒɓɔɕɖɗɘəɚɛɜɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮ"
    "ɯɰɱɲɳɴɵɶɸɹɺɻɽɾʀʁʂʃʄʈʉʊʋʌʍʎʏʐʑʒʔʕʘʙʛʜʝʟʡʢʰʲˈˌːˑ˞ˤ̧̩̪̯̃βεθχᵻ↓ⱱ")
"""The symbols of a Piper voice's `phoneme_id_map` (eSpeak NG's IPA), in NFD."""

_MISAKI = frozenset("AIOQWYbdfhijklmnpstuvwzæðŋɑɔəɛɜɡɪɹɾʃʊʌʒʔʤʧˈˌθᵊᵻ ")
"""misaki's American English phonemes (hibari reads these)."""

_TO_MNEMONIC = {
    "tʃ": "tS", "dʒ": "dZ", "eɪ": "eI", "aɪ": "aI", "ɔɪ": "OI", "aʊ": "aU", "oʊ": "oU",
    "əʊ": "@U", "ɪə": "i@", "ɛə": "e@", "ʊə": "U@", "ɜː": "3:", "iː": "i:", "uː": "u:",
    "ɑː": "A:", "ɔː": "O:", "əɹ": "3", "ɑɹ": "A@", "ɔɹ": "o@", "ɛɹ": "e@", "ɪɹ": "i@3",
    "p": "p", "b": "b", "t": "t", "d": "d", "k": "k", "ɡ": "g", "f": "f", "v": "v", "θ": "T",
    "ð": "D", "s": "s", "z": "z", "ʃ": "S", "ʒ": "Z", "h": "h", "m": "m", "n": "n", "ŋ": "N",
    "l": "l", "ɹ": "r", "r": "r", "j": "j", "w": "w", "i": "i", "ɪ": "I", "e": "e", "ɛ": "E",
    "æ": "a", "a": "a", "ɑ": "A:", "ɒ": "0", "ɔ": "O:", "o": "o", "ʊ": "U", "u": "u:", "ʌ": "V",
    "ə": "@", "ᵻ": "I#", "ɜ": "3:", "ɐ": "a#", "ɾ": "t#", "ʔ": "?", "x": "x", "ç": "C", "ʎ": "l^",
    "ɲ": "n^", "ʁ": "R", "y": "y", "ø": "Y", "œ": "W", "ɨ": "i\"", "ɯ": "u\"", "β": "B",
    "ɣ": "Q", "χ": "X", "ɬ": "l#", "ˈ": "'", "ˌ": ",", "ː": ":", " ": "_",
}
"""IPA -> eSpeak NG's phoneme mnemonics (its English phoneme table), longest first."""
_MNEMONIC_KEYS = sorted(_TO_MNEMONIC, key=len, reverse=True)


@dataclass(frozen=True)
class Converted:
    phonemes: str
    """The reading in the engine's set."""
    unknown: tuple[str, ...] = ()
    """Symbols of the client's IPA the engine has no sound for (left out of `phonemes`)."""


def _fold(ipa: str, english: bool) -> str:
    text = unicodedata.normalize("NFC", ipa.strip())
    text = "".join(_COMMON.get(c, c) for c in text)
    return text.replace("r", "ɹ") if english else text


def _expand(text: str) -> str:
    return "".join(_MISAKI_LETTERS.get(c, c) for c in text)


def _keep(text: str, inventory: frozenset[str]) -> Converted:
    unknown = tuple(dict.fromkeys(c for c in text if c not in inventory))
    return Converted("".join(c for c in text if c in inventory), unknown)


def _segments(text: str) -> list[str]:
    """`text` cut into symbols, each with the combining marks that follow it."""
    segments: list[str] = []
    for c in text:
        if segments and unicodedata.combining(c) and segments[-1] not in _STRESS:
            segments[-1] += c
        else:
            segments.append(c)
    return segments


def _is_nucleus(segment: str) -> bool:
    """A vowel (a diphthong's or an r-coloured vowel's first symbol is enough: the mark goes
    before it) or a syllabic consonant; a vowel marked non-syllabic is a glide."""
    marks = set(segment[1:])
    base = unicodedata.normalize("NFD", segment[0])[0]
    if base in _VOWELS:
        return not marks & _NON_SYLLABIC
    return bool(marks & _SYLLABIC)


def _is_onset(segment: str) -> bool:
    """A consonant a mark may pass: letters only, so a space, punctuation or another mark
    keeps a mark in its own word and syllable."""
    return (segment[0] not in _STRESS and unicodedata.category(segment[0]).startswith("L")
            and not _is_nucleus(segment))


def stress_before_nucleus(ipa: str) -> str:
    """`ipa` with each stress mark moved past the onset consonants after it (`ˈstɹeɪndʒ` ->
    `stɹˈeɪndʒ`), to where eSpeak NG and misaki put it. A mark with no nucleus after it in its
    word (`ˈpst`) stays where the client put it."""
    segments = _segments(ipa)
    out: list[str] = []
    i = 0
    while i < len(segments):
        segment = segments[i]
        if segment in _STRESS:
            j = i + 1
            while j < len(segments) and _is_onset(segments[j]):
                j += 1
            if j > i + 1 and j < len(segments) and _is_nucleus(segments[j]):
                out += [*segments[i + 1:j], segment]
                i = j
                continue
        out.append(segment)
        i += 1
    return "".join(out)


def to_engine(ipa: str, target: PhonemeSet, *, english: bool = True) -> Converted:
    """`ipa` in `target`'s symbols, stress marks before their vowels; what it cannot say in
    `unknown`."""
    text = stress_before_nucleus(_expand(_fold(ipa, english)))
    if target == "kokoro":
        return _keep(text, _KOKORO)
    if target == "espeak-ipa":
        converted = _keep(unicodedata.normalize("NFD", text), _ESPEAK_IPA)
        return Converted(unicodedata.normalize("NFC", converted.phonemes), converted.unknown)
    if target == "misaki":
        for ipa_pair, letter in (("eɪ", "A"), ("aɪ", "I"), ("oʊ", "O"), ("əʊ", "Q"),
                                 ("aʊ", "W"), ("ɔɪ", "Y"), ("dʒ", "ʤ"), ("tʃ", "ʧ"),
                                 ("ɜːɹ", "ɜɹ"), ("ː", ""), ("ɐ", "ə")):
            text = text.replace(ipa_pair, letter)
        return _keep(text, _MISAKI)
    return _mnemonics(text)


def _mnemonics(text: str) -> Converted:
    out: list[str] = []
    unknown: list[str] = []
    i = 0
    while i < len(text):
        for key in _MNEMONIC_KEYS:
            if text.startswith(key, i):
                out.append(_TO_MNEMONIC[key])
                i += len(key)
                break
        else:
            if text[i] not in unknown:
                unknown.append(text[i])
            i += 1
    return Converted("".join(out).strip("_"), tuple(unknown))


def unsayable(text: str, target: PhonemeSet) -> list[str]:
    """A warning for each `[word](/ipa/)` of `text` with symbols `target` cannot say."""
    warnings = []
    for match in INLINE.finditer(text):
        unknown = to_engine(match["ipa"], target).unknown
        if unknown:
            warnings.append(f"phonemes {' '.join(unknown)} of '{match['word']}' "
                            f"(/{match['ipa']}/) have no sound in this engine's phoneme set")
    return warnings
