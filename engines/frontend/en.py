"""English text normalization: what a person reads aloud for numbers, money, times and the like.

Rules run in order, most specific first (URLs before dots, money before plain numbers); each
replaces written forms with words and leaves everything else alone. Numbers are read the American
way, without "and" (one hundred twenty-one).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from num2words import num2words

from engines.frontend.spans import Spanned, apply_rules
from engines.frontend.units import NUMBER, UNIT_AFTER_NUMBER, UNITS
from engines.frontend.width import fold_width

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
_MONTH_ABBREVIATIONS = {m[:3]: m for m in MONTHS} | {"Sept": "September"}
_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

# (symbol, unit, units, minor unit, minor units)
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "US$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "", ""),
    "₹": ("rupee", "rupees", "paisa", "paise"),
    "₩": ("won", "won", "", ""),
}
_SCALES = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "mn": "million",
           "b": "billion", "B": "billion", "bn": "billion", "t": "trillion", "T": "trillion"}

_TITLES = {"Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Prof": "Professor", "Mt": "Mount",
           "Gen": "General", "Capt": "Captain", "Lt": "Lieutenant", "Sgt": "Sergeant",
           "Rev": "Reverend", "Gov": "Governor", "Sen": "Senator", "Rep": "Representative",
           "Pres": "President", "Hon": "Honorable"}
"""Abbreviations that are always titles."""
_BEFORE_NAME = {"Dr": "Doctor", "St": "Saint", "Ft": "Fort"}
"""Abbreviations read this way before a capitalized name, and as in `_AFTER_NAME` elsewhere."""
_AFTER_NAME = {"St": "Street", "Dr": "Drive", "Ft": "Fort", "Ave": "Avenue", "Rd": "Road",
               "Blvd": "Boulevard", "Ln": "Lane", "Ct": "Court", "Hwy": "Highway", "Jr": "Junior",
               "Sr": "Senior", "Inc": "Incorporated", "Ltd": "Limited", "Co": "Company",
               "Corp": "Corporation", "Bros": "Brothers"}
"""Abbreviations read this way elsewhere (after a name, or alone)."""
_WORDS = {"etc": "et cetera", "e.g": "for example", "i.e": "that is", "vs": "versus",
          "approx": "approximately", "dept": "department", "govt": "government",
          "misc": "miscellaneous", "min": "minutes", "hrs": "hours", "sec": "seconds"}

Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], str]]


def cardinal(number: str) -> str:
    """`1,234.05` -> `one thousand two hundred thirty-four point zero five`."""
    negative = number.startswith("-")
    whole, _, fraction = number.lstrip("-").replace(",", "").partition(".")
    if (len(whole) > 1 and whole.startswith("0")) or len(whole) > 15:
        words = digits(whole)  # codes and very long numbers are read digit by digit
    else:
        words = _plain(num2words(int(whole or "0")))
    if fraction:
        words += " point " + digits(fraction)
    return ("minus " if negative else "") + words


def digits(text: str) -> str:
    return " ".join(_DIGITS[int(d)] for d in text if d.isdigit())


def ordinal(n: int) -> str:
    return _plain(num2words(n, to="ordinal"))


def year(n: int) -> str:
    return _plain(num2words(n, to="year"))


def _plural(words: str) -> str:
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _plain(words: str) -> str:
    return words.replace(",", "").replace(" and ", " ")


def _money(match: re.Match[str]) -> str:
    one, many, minor_one, minor_many = _CURRENCIES[match["symbol"]]
    amount = match["amount"].replace(",", "")
    scale = _SCALES.get(match["scale"] or "", (match["scale"] or "").strip().lower())
    if scale:
        return f"{cardinal(amount)} {scale} {many}"
    whole, _, cents = amount.partition(".")
    if cents and (not minor_one or len(cents) > 2):  # ¥1.5, $0.005: no minor unit reads it
        return f"{cardinal(amount)} {many}"
    value, minor = int(whole or "0"), int((cents + "00")[:2])
    parts = [f"{cardinal(str(value))} {one if value == 1 else many}"] if value or not minor else []
    if minor:
        parts.append(f"{cardinal(str(minor))} {minor_one if minor == 1 else minor_many}")
    return " and ".join(parts)


def _ampm(match: re.Match[str]) -> str:
    """` P M`, keeping the full stop when `p.m.` also ended the sentence."""
    rest = match.string[match.end():]
    stop = match[0].endswith(".") and (not rest.strip() or re.match(r"\s+[A-Z]", rest))
    return f" {match['ampm'].upper()} M" + ("." if stop else "")


def _time(match: re.Match[str]) -> str:
    hour, minute = int(match["h"]), int(match["m"])
    suffix = match["ampm"]
    period = _ampm(match) if suffix else ""
    if minute == 0:
        if suffix:
            return cardinal(str(hour)) + period
        return "midnight" if hour in (0, 24) else (
            f"{cardinal(str(hour))} hundred" if hour > 12 else f"{cardinal(str(hour))} o'clock")
    spoken_minute = f"oh {_DIGITS[minute]}" if minute < 10 else cardinal(str(minute))
    return f"{cardinal(str(hour))} {spoken_minute}{period}"


def _hour_only(match: re.Match[str]) -> str:
    return cardinal(match["h"]) + _ampm(match)


def _date(month: int, day: int, year_text: str | None = None) -> str:
    spoken = f"{MONTHS[month - 1]} {ordinal(day)}"
    if year_text:
        full = int(year_text) if len(year_text) == 4 else 2000 + int(year_text)
        spoken += f", {year(full)}"
    return spoken


def _valid_date(month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= 31


_FRACTIONS = {(1, 2): "one half", (1, 3): "one third", (2, 3): "two thirds",
              (1, 4): "one quarter", (3, 4): "three quarters"}


def _slash_pair(match: re.Match[str]) -> str:
    a, b = int(match["a"]), int(match["b"])
    if (a, b) in _FRACTIONS:
        return _FRACTIONS[(a, b)]
    if _valid_date(a, b):
        return _date(a, b)
    if b in (2, 4):
        return f"{cardinal(str(a))} over {cardinal(str(b))}"
    return f"{cardinal(str(a))} {ordinal(b)}{'s' if a != 1 else ''}"


def _unit(match: re.Match[str]) -> str:
    unit = UNITS[match["unit"]]
    number = match["number"]
    return f"{cardinal(number)} {unit.en_one if number == '1' else unit.en_many}"


def _url(match: re.Match[str]) -> str:
    url = re.sub(r"^[a-z]+://", "", match[0].rstrip(".,;:!?"), flags=re.I)
    url = re.split(r"[?#]", url)[0].rstrip("/")
    trailing = match[0][len(match[0].rstrip(".,;:!?")):]
    return _spell_address(url) + trailing


def _email(match: re.Match[str]) -> str:
    user, _, domain = match[0].partition("@")
    return f"{_spell_address(user)} at {_spell_address(domain)}"


_ADDRESS_SYMBOLS = {".": " dot ", "/": " slash ", "-": " dash ", "_": " underscore ",
                    ":": " colon ", "~": " tilde ", "+": " plus ", "=": " equals "}


def _spell_address(text: str) -> str:
    spoken = "".join(_ADDRESS_SYMBOLS.get(c, c) for c in text)
    spoken = re.sub(r"\bwww\b", "W W W", spoken, flags=re.I)
    spoken = re.sub(r"\d+", lambda m: digits(m[0]) if len(m[0]) > 4 else cardinal(m[0]), spoken)
    return re.sub(r"\s+", " ", spoken).strip()


def _title(match: re.Match[str]) -> str:
    abbr = match["abbr"]
    before = match.string[: match.start()]
    if abbr == "St" and re.search(r"(?:\b[A-Z][a-z]+|\d(?:st|nd|rd|th)?)\s$", before):
        return "Street."  # "Main St. Then ...": a street, and the sentence ended there
    return (_TITLES | _BEFORE_NAME)[abbr]


def _after_name(match: re.Match[str]) -> str:
    # The period also ended the sentence when a capital or the end of text follows.
    tail = "." if match["end"] is not None else ""
    return _AFTER_NAME[match["abbr"]] + tail


def _word(match: re.Match[str]) -> str:
    tail = "." if match["end"] is not None else ""
    return _WORDS[match["abbr"]] + tail


def _digit_groups(groups: list[str]) -> str:
    """Phone digits read one by one, a short pause (a comma) between the written groups."""
    return ", ".join(digits(group) for group in groups if group)


def _international_phone(match: re.Match[str]) -> str:
    groups = re.findall(r"\d+", match[0])
    if sum(map(len, groups)) < 7:
        return match[0]  # too short for a phone number (`+5 points`)
    return "plus " + _digit_groups(groups)


def _nanp_phone(match: re.Match[str]) -> str:
    groups = [match["pa"] or match["a0"], match["b"], match["c"]]
    return _digit_groups(["1", *groups] if match["one"] else groups)


_PHONE_WORDS = re.compile(r"\b(?:call|phone|tel|dial|fax|ring|text|number|contact|cell|mobile)\b"
                          r"\W*(?:\w+\W+){0,2}$", re.I)


def _local_phone_or_range(match: re.Match[str]) -> str:
    """`555-0199` is a phone number; `500-1000` is a range unless a phone word comes first."""
    first, second = match["a"], match["b"]
    phone = (second.startswith("0") or int(second) <= int(first)
             or _PHONE_WORDS.search(match.string[: match.start()]) is not None)
    return _digit_groups([first, second]) if phone else match[0]


def _version_number(number: str) -> str:
    """`2.3.11` -> `two point three point eleven`: each part is a number of its own."""
    return " point ".join(cardinal(part) for part in number.split("."))


_NOT_NAMES = frozenset((
    "A", "About", "Above", "After", "Almost", "An", "And", "Around", "As", "At", "Below", "But",
    "By", "Each", "Every", "For", "From", "In", "Is", "It", "Just", "Nearly", "Of", "On", "Only",
    "Or", "Over", "Per", "The", "To", "Under", "Up", "Was", "With",
))
"""Capitalized words that start a sentence rather than name a product (`At 3.50 each`)."""


def _named_version(match: re.Match[str]) -> str:
    """`Python 3.11` -> `Python three point eleven`: a number after a name is a version."""
    if match["name"] in _NOT_NAMES:
        return match[0]
    return f"{match['name']} {_version_number(match['v'])}"


def _dotted(match: re.Match[str]) -> str:
    parts = match[0].split(".")
    if len(parts) == 4 and all(len(p) <= 3 and int(p) <= 255 for p in parts):
        return " dot ".join(cardinal(p) for p in parts)  # an IPv4 address
    return _version_number(match[0])


_AMPM = r"\s?(?P<ampm>[AaPp])(?:\.\s?[Mm]\.|\s?[Mm]\b)"
_END = r"(?P<end>(?=\s*$)|(?=\s+[A-Z]))?"
_RULES: list[Rule] = [
    (re.compile(r"\b(?:https?://|www\.)[^\s<>\"]+", re.I), _url),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), _email),
    (re.compile(r"\b(?P<abbr>" + "|".join(_TITLES) + r")\.(?=\s)"), _title),
    (re.compile(r"\b(?P<abbr>" + "|".join(_BEFORE_NAME) + r")\.(?=\s+[A-Z])"), _title),
    (re.compile(r"\b(?P<abbr>" + "|".join(_AFTER_NAME) + r")\." + _END), _after_name),
    (re.compile(r"(?<![\w.])(?P<abbr>etc|e\.g|i\.e|vs|approx|dept|govt|misc|min|hrs|sec)\."
                + _END), _word),
    (re.compile(r"\bvs\b"), lambda m: "versus"),
    # Phone numbers: `+44 20 7946 0958`, `+1 800 555 0199`, `(800) 555-0199`, `800.555.0199`,
    # `1-800-555-0199`, `555-0199`; digit by digit, a pause between the groups.
    (re.compile(r"(?<![\w+])\+\d{1,3}(?:[ .-]?\(?\d{1,5}\)?){1,5}(?!\d)"),
     _international_phone),
    (re.compile(r"(?<![\w.+-])(?P<one>1[ .-])?(?:\((?P<pa>\d{3})\)\s?|(?P<a0>\d{3})[ .-])"
                r"(?P<b>\d{3})[ .-](?P<c>\d{4})(?![\w-]|\.\d)"),
     _nanp_phone),
    (re.compile(r"(?<![\w.-])(?P<a>\d{3})-(?P<b>\d{4})(?![\w-]|\.\d)"), _local_phone_or_range),
    # Versions and dotted numbers: `v2.3.1`, `Python 3.11`, `1.2.3`, `192.168.0.1`.
    (re.compile(r"\b[vV](?P<v>\d+(?:\.\d+)+)\b"),
     lambda m: "version " + _version_number(m["v"])),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+){2,}\b(?!\.\d)"), _dotted),
    (re.compile(r"\b(?P<name>[A-Z][A-Za-z+#]*[a-zA-Z+#]|[Vv]ersion|[Rr]elease)\s"
                r"(?P<v>\d+\.\d+(?:\.\d+)*)\b(?![.,]?\d|%)"), _named_version),
    (re.compile(r"\bNo\.\s?(?=\d)"), lambda m: "number "),
    (re.compile(r"#(?=\d)"), lambda m: "number "),
    (re.compile(r"\b(?P<m>" + "|".join(_MONTH_ABBREVIATIONS) + r")\.(?=\s*\d)"),
     lambda m: _MONTH_ABBREVIATIONS[m["m"]]),
    # A range of amounts, `$5-$10`: "five dollars to ten dollars".
    (re.compile(r"(?<=\d)\s?[–-]\s?(?=(?:US\$|[$€£¥₹₩])\d)"), lambda m: " to "),
    (re.compile(r"(?P<symbol>US\$|[$€£¥₹₩])\s?(?P<amount>" + NUMBER + r")"
                r"(?:\s?(?P<scale>mn|bn|[kKmMbBtT]\b|(?:thousand|million|billion|trillion)\b))?"),
     _money),
    (re.compile(r"(?P<n>-?" + NUMBER + r")\s?%"), lambda m: f"{cardinal(m['n'])} percent"),
    (re.compile(r"(?<=\d:\d\d)\s?[–-]\s?(?=\d{1,2}:\d\d)"), lambda m: " to "),
    (re.compile(r"\b(?P<h>[01]?\d|2[0-4]):(?P<m>[0-5]\d)\b(?!:\d)(?:" + _AMPM + ")?"), _time),
    (re.compile(r"\b(?P<h>1[0-2]|0?[1-9])" + _AMPM), _hour_only),
    (re.compile(r"\b(?P<y>\d{4})-(?P<mo>\d{2})-(?P<d>\d{2})\b"),
     lambda m: _date(int(m["mo"]), int(m["d"]), m["y"]) if _valid_date(int(m["mo"]), int(m["d"]))
     else m[0]),
    (re.compile(r"\b(?P<mo>\d{1,2})/(?P<d>\d{1,2})/(?P<y>\d{4}|\d{2})\b"),
     lambda m: _date(int(m["mo"]), int(m["d"]), m["y"]) if _valid_date(int(m["mo"]), int(m["d"]))
     else m[0]),
    (re.compile(r"\b(?P<a>\d{1,2})/(?P<b>\d{1,2})\b(?!/)"), _slash_pair),
    (re.compile(r"\b(?P<mo>" + "|".join(MONTHS) + r")\s(?P<d>\d{1,2})(?:st|nd|rd|th)?\b(?!:)"),
     lambda m: f"{m['mo']} {ordinal(int(m['d']))}"),
    (re.compile(r"\b(?P<d>\d{1,2})(?:st|nd|rd|th)?\s(?P<mo>" + "|".join(MONTHS) + r")\b"),
     lambda m: f"the {ordinal(int(m['d']))} of {m['mo']}"),
    (re.compile(r"\b(?P<a>\d{3})-(?P<b>\d{3})-(?P<c>\d{4})\b"),
     lambda m: ", ".join(digits(m[g]) for g in ("a", "b", "c"))),
    (re.compile(r"(?<=\d)\s?[–-]\s?(?=\d)"), lambda m: " to "),
    (re.compile(r"(?<![\w.])-(?=\d)"), lambda m: "minus "),
    (UNIT_AFTER_NUMBER, _unit),
    (re.compile(r"\b(?P<n>\d+)(?:st|nd|rd|th)\b"), lambda m: ordinal(int(m["n"]))),
    (re.compile(r"\b(?P<y>(?:1[1-9]|20)\d0)s\b"), lambda m: _plural(year(int(m["y"])))),
    (re.compile(r"(?<![\d.,])'(?P<d>[2-9]0)s\b"), lambda m: _plural(cardinal(m["d"]))),
    (re.compile(r"(?<![\d.,$])\b(?P<y>1[1-9]\d\d|20\d\d)\b(?![.,]\d|%)"),
     lambda m: year(int(m["y"]))),
    (re.compile(r"\b(?P<n>\d+)(?P<letters>[A-Z]{1,3})\b"),
     lambda m: f"{cardinal(m['n'])} {' '.join(m['letters'])}"),
    (re.compile(r"(?<!\d)" + NUMBER + r"(?!\d)"), lambda m: cardinal(m[0])),
    (re.compile(r"\s&\s"), lambda m: " and "),
    (re.compile(r"(?<=\s)\+(?=\s)"), lambda m: "plus"),
    (re.compile(r"(?<=\s)=(?=\s)"), lambda m: "equals"),
]


_SPACES = re.compile(r"[ \t]{2,}")


def normalize(text: str) -> str:
    """English text with its numbers, symbols and abbreviations written as spoken words."""
    return normalize_spanned(Spanned.of(text)).text


def normalize_spanned(text: Spanned) -> Spanned:
    """`normalize`, each character remembering the span of the input it stands for."""
    text = apply_rules(text.fold(fold_width), _RULES)
    return text.sub(_SPACES, lambda m: " ")
