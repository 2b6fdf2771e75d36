"""Full-width forms (１２３, ＡＢＣ, ％) folded to ASCII so one set of rules reads them."""

from __future__ import annotations

import re
import unicodedata

_ALL = {cp: cp - 0xFEE0 for cp in range(0xFF01, 0xFF5F)} | {0x3000: 0x20}
_ALNUM = {cp: cp - 0xFEE0 for cp in (*range(0xFF10, 0xFF1A), *range(0xFF21, 0xFF3B),
                                     *range(0xFF41, 0xFF5B))}
_ALNUM |= {ord(a): ord(b) for a, b in zip("％＄￥．", "%$¥.", strict=True)}
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")


def _ascii_digit(match: re.Match[str]) -> str:
    return str(unicodedata.decimal(match[0]))


def fold_width(text: str) -> str:
    """Fold every full-width ASCII form, punctuation included (for Latin-script text)."""
    return text.translate(_ALL)


def fold_alnum(text: str) -> str:
    """Fold full-width digits, letters and `％＄￥．` only: CJK text keeps its punctuation.

    Decimal digits of every other script (٣, ३, 𝟑) become ASCII too: the number readers know
    only 0-9, while the rules' `\\d` matches them all.
    """
    return _OTHER_DIGIT.sub(_ascii_digit, text.translate(_ALNUM))
