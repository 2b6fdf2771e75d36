"""Punctuation tables for `app.text.split`, one entry per script family.

Each family may name four kinds of marks:
- ``spaced_end``: ends a sentence only before whitespace or the end of text, so "3.14",
  "e.g." and "Yahoo!Inc" stay whole;
- ``end``: ends a sentence on its own, no space needed after it;
- ``spaced_weak``: a clause break before whitespace ("1,000" and "12:30" stay whole);
- ``weak``: a clause break on its own.
"""

from __future__ import annotations

FAMILIES: dict[str, dict[str, str]] = {
    # en fr de es it pt ru ko. Spanish "¿¡" open a sentence (see OPENERS); French puts a space
    # before "! ? : ;", which the splitter never cuts in front of.
    "latin_cyrillic_hangul": {
        "spaced_end": ".!?…",
        "end": "‼⁇⁈⁉",
        "spaced_weak": ",;:—–",
    },
    # zh ja: full-width marks are never followed by a space.
    "cjk": {"end": "。！？．｡", "weak": "、，；：､"},
    # hi: danda and double danda; Hindi also uses the Latin "? ! ,".
    "devanagari": {"end": "।॥"},
    # ar ur fa: question mark, Urdu full stop; comma and semicolon.
    "arabic": {"end": "؟۔", "weak": "،؛"},
    # el: the Greek question mark is usually typed as ";", which counts after a Greek letter.
    "greek": {"spaced_end": "\u037e", "spaced_weak": "\u0387"},
    "armenian": {"end": "։", "weak": "՝"},
    "ethiopic": {"end": "።፧", "weak": "፣፤፥፦"},
    "khmer": {"end": "។៕"},
    "myanmar": {"end": "။", "weak": "၊"},
    # th: no sentence marks at all; a space between two Thai letters ends a phrase.
    "thai": {},
}

QUOTES = "\"'“”‘’«»‹›„‚＂＇"
# Closing marks right after a terminator stay with its sentence: `He said "Stop." Then`.
CLOSERS = QUOTES + ")]}）］｝】〉》〕」』"
# Skipped when looking at how the next sentence starts: `¿Qué?`, `"Then`.
OPENERS = QUOTES + "([{（［｛【〈《〔「『¿¡"
# French writes `« Bonjour ! »`: a space, then the closing guillemet.
SPACED_CLOSERS = "»›"

# Inclusive code point ranges.
GREEK = ((0x0370, 0x03FF), (0x1F00, 0x1FFF))
# Scripts written without spaces between words, where a space separates phrases.
PHRASE_SPACED = ((0x0E00, 0x0E7F), (0x0E80, 0x0EFF))  # Thai, Lao
# Scripts written without spaces, where "OK!次" still ends a sentence at "!".
UNSPACED = ((0x3000, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3FFFF))  # CJK, kana

# Words that take a period without ending a sentence, space-separated and compared lowercased;
# initials like "U.S", "e.g" and "z.B" are recognised by their shape. Left out on purpose: words
# that often end a sentence too ("etc", "usw", "inc", "no").
ABBREVIATIONS: dict[str, str] = {
    "en": "mr mrs ms dr prof sr jr st vs approx fig figs vol cf al ca dept gen gov lt col capt "
    "sgt rev hon mt",
    "fr": "mme mlle mm pr ste p.ex av bd env",
    "de": "hr fr nr str bzw vgl ggf inkl evtl bspw geb gem",
    "es": "sra srta dra ud uds lic ing pág núm",
    "it": "sig sigg dott avv geom arch",
    "pt": "eng exmo exma",
    "ru": "проф ул стр рис им тыс млн млрд акад",
}
