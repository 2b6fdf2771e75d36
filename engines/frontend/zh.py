"""Chinese: numbers, dates, times, percentages, money and units written as characters; words
segmented with jieba; pinyin chosen per word by pypinyin (so 银行 reads háng, 行走 xíng).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from engines.frontend.pinyin_ipa import syllable_phonemes
from engines.frontend.spans import Spanned, apply_rules
from engines.frontend.units import NUMBER, UNIT_AFTER_NUMBER, UNITS
from engines.frontend.width import fold_alnum

HAN = re.compile(r"[\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_DIGITS = "零一二三四五六七八九"
_CURRENCIES = {"¥": "元", "US$": "美元", "$": "美元", "€": "欧元", "£": "英镑", "₩": "韩元",
               "HK$": "港元"}
_MEASURE_WORDS = "个位只本次件条张种名家辆双对口台天周岁点项门座棵头匹"
"""After these, the number 2 is read 两 (两个人), not 二."""
_PUNCTUATION = str.maketrans({"，": ",", "。": ".", "！": "!", "？": "?", "；": ";", "：": ":",
                              "、": ",", "（": "(", "）": ")", "《": "“", "》": "”",
                              "「": "“", "」": "”", "『": "“", "』": "”", "～": "~"})

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def number(text: str) -> str:
    """`12.5` -> 十二点五; codes (leading zero) and numbers over 16 digits digit by digit."""
    text = text.replace(",", "")
    whole = text.lstrip("-").split(".")[0]
    if len(whole) > 16 or (len(whole) > 1 and whole.startswith("0")):
        sign = "负" if text.startswith("-") else ""
        whole_part, _, fraction = text.lstrip("-").partition(".")
        spoken = digits(whole_part) + ("点" + digits(fraction) if fraction else "")
        return sign + spoken
    import cn2an  # here: importing it takes about half a second, paid only by Chinese text

    return str(cn2an.an2cn(text, "low"))


def digits(text: str) -> str:
    return "".join(_DIGITS[int(d)] for d in text if d.isdigit())


def _time(match: re.Match[str]) -> str:
    hour, minute = int(match["h"]), int(match["m"])
    spoken = ("两" if hour == 2 else number(str(hour))) + "点"
    if minute:
        spoken += ("零" if minute < 10 else "") + number(str(minute)) + "分"
    if match["s"] and int(match["s"]):
        spoken += number(str(int(match["s"]))) + "秒"
    return spoken


def _date(match: re.Match[str]) -> str:
    month, day = number(str(int(match["mo"]))), number(str(int(match["d"])))
    return f"{digits(match['y'])}年{month}月{day}日"


def _unit(match: re.Match[str]) -> str:
    return UNITS[match["unit"]].zh.format(number(match["number"]))


def _money(match: re.Match[str]) -> str:
    return number(match["amount"]) + _CURRENCIES[match["symbol"]]


_RULES: list[Rule] = [
    (re.compile(r"(?<=\d),(?=\d{3}(?!\d))"), lambda m: ""),
    (re.compile(r"(?P<y>\d{4})[-/.](?P<mo>\d{1,2})[-/.](?P<d>\d{1,2})(?![\d.])"), _date),
    (re.compile(r"(?P<y>\d{4})(?=年)"), lambda m: digits(m["y"])),
    (re.compile(r"(?P<h>[01]?\d|2[0-4])[:：](?P<m>[0-5]\d)(?:[:：](?P<s>[0-5]\d))?(?!\d)"), _time),
    (re.compile(r"(?P<n>-?" + NUMBER + r")\s?%"),
     lambda m: ("负" if m["n"].startswith("-") else "") + "百分之" + number(m["n"].lstrip("-"))),
    (re.compile(r"(?P<symbol>HK\$|US\$|[¥$€£₩])\s?(?P<amount>" + NUMBER + ")"), _money),
    (re.compile(r"(?<=\d)\s?[-~～—]\s?(?=\d)"), lambda m: "到"),
    (re.compile(r"(?<![0-9A-Za-z.])-(?=\d)"), lambda m: "负"),
    (UNIT_AFTER_NUMBER, _unit),
    (re.compile(r"(?P<a>\d+)/(?P<b>\d+)"), lambda m: f"{number(m['b'])}分之{number(m['a'])}"),
    (re.compile(r"(?<![\d.第])2(?=[" + _MEASURE_WORDS + "])"), lambda m: "两"),
    (re.compile(r"(?<!\d)-?\d+(?:\.\d+)?"), lambda m: number(m[0])),
]


def normalize(text: str) -> str:
    """Chinese text with digits and symbols written as the characters a reader says."""
    return normalize_spanned(Spanned.of(text)).text


def normalize_spanned(text: Spanned) -> Spanned:
    """`normalize`, each character remembering the span of the input it stands for."""
    return apply_rules(text.fold(fold_alnum), _RULES)


_jieba_lock = threading.Lock()


def words(text: str) -> list[str]:
    """jieba's segmentation of a run of Han characters."""
    import jieba

    with _jieba_lock:  # held while cutting too, so `release` never pulls the dictionary away
        if not jieba.dt.initialized:
            jieba.setLogLevel(logging.WARNING)
            jieba.initialize()
        return [w for w in jieba.lcut(text, cut_all=False) if w.strip()]


def release() -> None:
    """Drop jieba's dictionary (about 70 MB); the next `words` call loads it again."""
    import jieba

    with _jieba_lock:
        if jieba.dt.initialized:
            jieba.dt.FREQ = {}
            jieba.dt.total = 0
            jieba.dt.initialized = False


def pinyin(text: str) -> list[list[str]]:
    """Tone-numbered pinyin (5 = neutral) per word of each Han run, tone sandhi applied."""
    from pypinyin import Style, lazy_pinyin

    out: list[list[str]] = []
    for run in HAN.findall(text):
        segmented = words(run)
        syllables = lazy_pinyin(segmented, style=Style.TONE3, neutral_tone_with_five=True,
                                tone_sandhi=True)
        for word in segmented:
            out.append(syllables[: len(word)])
            syllables = syllables[len(word):]
    return out


def phonemes(text: str) -> str:
    """Normalized Chinese text -> Kokoro phonemes: one group per word, punctuation kept."""
    pieces: list[str] = []
    position = 0
    for match in HAN.finditer(text):
        pieces.append(_other(text[position:match.start()]))
        pieces.append(" ".join("".join(syllable_phonemes(s) for s in word)
                               for word in pinyin(match[0])))
        position = match.end()
    pieces.append(_other(text[position:]))
    return re.sub(r"\s+", " ", "".join(pieces)).strip()


def _other(text: str) -> str:
    """Text between Han runs: punctuation made ASCII, with a space after it."""
    text = text.translate(_PUNCTUATION)
    return re.sub(r"([,.!?;:])\s*", r"\1 ", text)
