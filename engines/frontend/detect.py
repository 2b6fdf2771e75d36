"""Which language each stretch of a text is in, told by its writing system.

A segment is cut into runs of one script; digits, spaces, punctuation and units are neutral and
join the run they stand in (or the first run, at the start). Han reads as Japanese when the segment
has kana and as Chinese otherwise; Latin reads in the voice's language when that language is
written in Latin, else English. A request `language` claims every run in a script it is written in
(`ja` makes kana-less kanji Japanese); runs in other scripts are still detected.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from enum import Enum

from engines.frontend.units import UNIT_AFTER_NUMBER


class Script(Enum):
    LATIN = "Latin"
    HAN = "Han"
    KANA = "Kana"
    HANGUL = "Hangul"
    CYRILLIC = "Cyrillic"
    GREEK = "Greek"
    ARABIC = "Arabic"
    HEBREW = "Hebrew"
    DEVANAGARI = "Devanagari"
    BENGALI = "Bengali"
    TAMIL = "Tamil"
    THAI = "Thai"
    GEORGIAN = "Georgian"
    ARMENIAN = "Armenian"


SCRIPT_LANGUAGE: dict[Script, str] = {
    Script.LATIN: "en", Script.HAN: "zh", Script.KANA: "ja", Script.HANGUL: "ko",
    Script.CYRILLIC: "ru", Script.GREEK: "el", Script.ARABIC: "ar", Script.HEBREW: "he",
    Script.DEVANAGARI: "hi", Script.BENGALI: "bn", Script.TAMIL: "ta", Script.THAI: "th",
    Script.GEORGIAN: "ka", Script.ARMENIAN: "hy",
}
"""The language a run of a script is read in when nothing says otherwise."""

_LANGUAGE_SCRIPTS: dict[str, frozenset[Script]] = {
    "zh": frozenset({Script.HAN}), "yue": frozenset({Script.HAN}),
    "ja": frozenset({Script.HAN, Script.KANA}), "ko": frozenset({Script.HANGUL, Script.HAN}),
    **{lang: frozenset({Script.CYRILLIC})
       for lang in ("ru", "uk", "be", "bg", "mk", "kk", "ky", "tt", "ba", "mn", "cv")},
    "el": frozenset({Script.GREEK}), "grc": frozenset({Script.GREEK}),
    **{lang: frozenset({Script.ARABIC}) for lang in ("ar", "fa", "ur", "ps", "sd", "ug")},
    "he": frozenset({Script.HEBREW}), "yi": frozenset({Script.HEBREW}),
    **{lang: frozenset({Script.DEVANAGARI}) for lang in ("hi", "mr", "ne", "sa", "kok", "mai")},
    "bn": frozenset({Script.BENGALI}), "as": frozenset({Script.BENGALI}),
    "ta": frozenset({Script.TAMIL}), "th": frozenset({Script.THAI}),
    "ka": frozenset({Script.GEORGIAN}), "hy": frozenset({Script.ARMENIAN}),
}
_ALIASES = {"cmn": "zh", "zho": "zh", "chi": "zh", "jpn": "ja", "eng": "en", "kor": "ko"}
_NAME_PREFIXES: tuple[tuple[str, Script], ...] = (
    ("CJK UNIFIED IDEOGRAPH", Script.HAN), ("CJK COMPATIBILITY IDEOGRAPH", Script.HAN),
    ("IDEOGRAPHIC", Script.HAN), ("BOPOMOFO", Script.HAN),
    ("HIRAGANA", Script.KANA), ("KATAKANA", Script.KANA), ("HALFWIDTH KATAKANA", Script.KANA),
    ("HANGUL", Script.HANGUL), ("HALFWIDTH HANGUL", Script.HANGUL),
    *((s.value.upper(), s) for s in Script if s not in (Script.HAN, Script.KANA, Script.HANGUL)),
)


def canonical(tag: str) -> str:
    """`en_US` -> `en-us`; `cmn`, `zh-CN` and `zh-Hans` -> `zh` (one Chinese front end)."""
    tag = tag.strip().lower().replace("_", "-")
    base = _ALIASES.get(tag.split("-")[0], tag.split("-")[0])
    return "zh" if base == "zh" else tag if tag.split("-")[0] == base else base


def base_language(tag: str) -> str:
    """`en-gb` -> `en`, `cmn` -> `zh`."""
    return canonical(tag).split("-")[0] if tag else ""


def language_matches(tag: str, wanted: str) -> bool:
    """Whether a voice's language `tag` answers a filter: `en` takes en-us and en-gb, `zh` takes
    cmn, `en-gb` takes only British English."""
    if not tag:
        return False
    have, want = canonical(tag), canonical(wanted)
    return have == want or have.startswith(want + "-")


def scripts_of(language: str) -> frozenset[Script]:
    return _LANGUAGE_SCRIPTS.get(base_language(language), frozenset({Script.LATIN}))


def script_of(char: str) -> Script | None:
    """The writing system of a letter; None for digits, punctuation, spaces and symbols."""
    category = unicodedata.category(char)
    if not (category.startswith("L") or category in ("Nl", "Mn", "Mc")):
        return None
    if char in "々〆ヵヶ":  # iteration and abbreviation marks written among kanji
        return Script.HAN if char in "々〆" else Script.KANA
    name = unicodedata.name(char, "")
    for prefix, script in _NAME_PREFIXES:
        if name.startswith(prefix):
            return script
    return Script.LATIN if name.startswith(("LATIN", "FULLWIDTH LATIN")) else None


def has_kana(text: str) -> bool:
    return any(script_of(c) is Script.KANA for c in text)


@dataclass(frozen=True)
class Run:
    text: str
    language: str
    """A canonical tag: `zh`, `ja`, `en`, `en-gb`, `fr-fr`, ..."""


class Detector:
    def __init__(self, default: str, override: str | None, kana: bool) -> None:
        self._default = canonical(default) if default else "en"
        self._override = canonical(override) if override else None
        self._kana = kana

    def language(self, script: Script) -> str:
        if self._override and script in scripts_of(self._override):
            return self._override
        if script in (Script.HAN, Script.KANA):
            return "ja" if self._kana or script is Script.KANA else "zh"
        if script in scripts_of(self._default):
            return self._default
        return SCRIPT_LANGUAGE[script]

    @property
    def fallback(self) -> str:
        """The language of a text with no letters at all (digits and symbols only)."""
        return self._override or self._default


def split_runs(text: str, default: str = "en", override: str | None = None) -> list[Run]:
    """Cut `text` into runs of one language; joined, the runs' texts give `text` back."""
    detector = Detector(default, override, has_kana(text))
    neutral = _neutral_mask(text)
    runs: list[list[str]] = []  # [language, text] pairs; language "" while still undecided
    for i, char in enumerate(text):
        script = None if neutral[i] else script_of(char)
        language = detector.language(script) if script else ""
        if runs and (not language or runs[-1][0] in ("", language)):
            runs[-1][0] = runs[-1][0] or language
            runs[-1][1] += char
        else:
            runs.append([language, char])
    return [Run(chunk, language or detector.fallback) for language, chunk in runs]


def _neutral_mask(text: str) -> list[bool]:
    mask = [False] * len(text)
    for match in UNIT_AFTER_NUMBER.finditer(text):
        for i in range(match.start(), match.end()):
            mask[i] = True
    return mask


def detect(text: str, default: str = "en", override: str | None = None) -> str:
    """The language of most of `text`'s letters."""
    counts: dict[str, int] = {}
    for run in split_runs(text, default, override):
        letters = sum(1 for c in run.text if script_of(c))
        counts[run.language] = counts.get(run.language, 0) + letters
    return max(counts, key=lambda k: counts[k]) if counts else canonical(override or default)
