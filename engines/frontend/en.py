"""English text normalization: what a person reads aloud for numbers, money, times and the like.

Rules run in order, most specific first (URLs before dots, money before plain numbers); each
replaces written forms with words and leaves everything else alone. Numbers are read the American
way, without "and" (one hundred twenty-one).

Every English engine reads through these rules (hibari's G2P included), so no character with a
numeric value is left for an engine to read its own way or fail on: digits of other scripts are
folded to ASCII first, and fractions (`3½`), superscripts (`m²`, `x³`), subscripts (`H₂O`) and
circled, parenthesized or Roman numerals (`①`, `⑴`, `Ⅻ`) are read by their value.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from fractions import Fraction

from num2words import num2words

from engines.frontend.spans import Spanned, apply_rules
from engines.frontend.units import NUMBER, UNIT_AFTER_NUMBER, UNITS
from engines.frontend.width import fold_alnum, fold_width

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
    "USD": ("dollar", "dollars", "cent", "cents"),
    "EUR": ("euro", "euros", "cent", "cents"),
    "GBP": ("pound", "pounds", "penny", "pence"),
    "JPY": ("yen", "yen", "", ""),
    "INR": ("rupee", "rupees", "paisa", "paise"),
    "Rs": ("rupee", "rupees", "paisa", "paise"),
    "Rs.": ("rupee", "rupees", "paisa", "paise"),
}
_SCALES = {"k": "thousand", "K": "thousand", "m": "million", "M": "million", "mn": "million",
           "b": "billion", "B": "billion", "bn": "billion", "t": "trillion", "T": "trillion"}

_TITLES = {"Mr": "Mister", "Mrs": "Missus", "Ms": "Miz", "Prof": "Professor", "Mt": "Mount",
           "Gen": "General", "Capt": "Captain", "Lt": "Lieutenant", "Sgt": "Sergeant",
           "Rev": "Reverend", "Gov": "Governor", "Sen": "Senator", "Rep": "Representative",
           "Pres": "President", "Hon": "Honorable", "Col": "Colonel", "Maj": "Major",
           "Cmdr": "Commander", "Adm": "Admiral", "Cpl": "Corporal", "Supt": "Superintendent",
           "Msgr": "Monsignor", "Atty": "Attorney"}
"""Abbreviations that are always titles."""
_BEFORE_NAME = {"Dr": "Doctor", "St": "Saint", "Ft": "Fort", "Fr": "Father"}
"""Abbreviations read this way before a capitalized name, and as in `_AFTER_NAME` elsewhere."""
_AFTER_NAME = {"St": "Street", "Dr": "Drive", "Ft": "Fort", "Ave": "Avenue", "Rd": "Road",
               "Blvd": "Boulevard", "Ln": "Lane", "Ct": "Court", "Hwy": "Highway", "Jr": "Junior",
               "Sr": "Senior", "Inc": "Incorporated", "Ltd": "Limited", "Co": "Company",
               "Corp": "Corporation", "Bros": "Brothers"}
"""Abbreviations read this way elsewhere (after a name, or alone)."""
_WORDS = {"etc": "et cetera", "e.g": "for example", "i.e": "that is", "vs": "versus",
          "approx": "approximately", "dept": "department", "govt": "government",
          "misc": "miscellaneous", "min": "minutes", "hrs": "hours", "sec": "seconds",
          "Vol": "Volume", "vol": "volume", "Fig": "Figure", "fig": "figure", "Ch": "Chapter",
          "ch": "chapter", "pp": "pages", "cf": "compare",
          "Apt": "Apartment", "Bldg": "Building", "Univ": "University", "Assn": "Association",
          "Dept": "Department"}
"""Abbreviations with a full stop, read this way wherever they stand."""
_SHORTHANDS = {"w/o": "without", "w/": "with", "aka": "also known as", "AKA": "also known as",
               "BTW": "by the way", "IMO": "in my opinion", "TBD": "to be determined"}
"""Shorthands written without a full stop."""
_ROMAN_CARDINAL = ("Chapter", "chapter", "Part", "part", "Act", "Scene", "Section", "section",
                   "Volume", "volume", "Book", "book", "Phase", "phase", "Article", "article",
                   "World War", "Mark", "Type", "type", "Level", "level", "Stage", "stage",
                   "Super Bowl", "Apollo", "Gemini", "Final Fantasy", "Episode", "Round", "round",
                   "Rocky", "Star Wars Episode")
"""Words after which a Roman numeral is a number (Chapter IV: Chapter four)."""
_ROMAN_ORDINAL = ("Pope", "King", "Queen", "Henry", "Louis", "Edward", "George", "William",
                  "Charles", "James", "Richard", "Elizabeth", "Napoleon", "Pius", "Benedict",
                  "Leo", "John Paul", "Ramses", "Frederick", "Philip", "Alexander", "Nicholas",
                  "Peter", "Catherine", "Ivan", "Umberto", "Victor Emmanuel", "Gustav",
                  "Christian", "Ferdinand")
"""Names after which a Roman numeral is an ordinal (Henry VIII: Henry the eighth)."""
_ROMAN = {"I": 1, "V": 5, "X": 10, "L": 50}
_SYMBOL_WORDS = {"±": "plus or minus", "×": "times", "÷": "divided by", "§": "section",
                 "¶": "paragraph", "©": "copyright", "→": "to"}
"""Symbols hibari's G2P reads as nothing (its package's normalizer wrote them out)."""

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
    """Each character with a digit value (`7`, `٧`, `⁷`, `⑦`) read as its digit."""
    values = (unicodedata.digit(c, None) for c in text)
    return " ".join(_DIGITS[value] for value in values if value is not None)


def ordinal(n: int) -> str:
    return _plain(num2words(n, to="ordinal"))


def year(n: int) -> str:
    return _plain(num2words(n, to="year"))


def fraction(numerator: int, denominator: int, after_whole: bool = False) -> str:
    """`3/4` -> `three quarters`; after a whole number a lone part is "a" (three and a half)."""
    if denominator == 2:
        part = "half" if numerator == 1 else "halves"
    elif denominator == 4:
        part = "quarter" if numerator == 1 else "quarters"
    else:
        part = ordinal(denominator) + ("" if numerator == 1 else "s")
    count = "a" if after_whole and numerator == 1 else cardinal(str(numerator))
    return f"{count} {part}"


def numeral(char: str) -> str | None:
    """What a character with a numeric value reads as (`⑩` ten, `⅜` three eighths, `৴` one
    sixteenth); None for any other character."""
    value = unicodedata.numeric(char, None)
    if value is None:
        return None
    number = Fraction(value).limit_denominator(1000)
    sign = "minus " if number < 0 else ""
    number = abs(number)
    whole, part = divmod(number.numerator, number.denominator)
    if not part:
        return sign + cardinal(str(whole))
    if not whole:
        return sign + fraction(part, number.denominator)
    return f"{sign}{cardinal(str(whole))} and {fraction(part, number.denominator, True)}"


def _padded(match: re.Match[str], words: str) -> str:
    """`words` with a space where the match touched a letter or digit (`H₂O`: H two O)."""
    text, start, end = match.string, match.start(), match.end()
    before = " " if start > 0 and text[start - 1].isalnum() and words else ""
    after = " " if end < len(text) and text[end].isalnum() and words else ""
    return before + words + after


_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_SUBSCRIPTS = "₀₁₂₃₄₅₆₇₈₉"
_VULGAR = "¼½¾⅐⅑⅒⅓⅔⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞↉"
_AREA_UNITS = ("km", "cm", "mm", "m", "ft", "mi", "yd", "nm", "µm")
"""Lengths a `²` or `³` after makes an area or a volume (`m²`: square meters)."""
_POWERS = {2: "square", 3: "cubic"}


def _script_number(text: str) -> int:
    return int("".join(str(unicodedata.digit(c)) for c in text))


def _vulgar(match: re.Match[str]) -> str:
    numerator, _, denominator = unicodedata.normalize("NFKC", match["frac"]).partition("\u2044")
    return _whole_and_part(match, int(numerator), int(denominator))


def _whole_and_part(match: re.Match[str], numerator: int, denominator: int) -> str:
    if match["whole"]:
        words = f"{cardinal(match['whole'])} and {fraction(numerator, denominator, True)}"
    else:
        words = fraction(numerator, denominator)
    return _padded(match, words)


def _area(match: re.Match[str]) -> str:
    unit = UNITS[match["unit"]]
    power = _POWERS[unicodedata.digit(match["power"])]
    number = match.groupdict().get("number")
    if number is None:  # `per m²`
        return _padded(match, f"{power} {unit.en_one}")
    return f"{cardinal(number)} {power} {unit.en_one if number == '1' else unit.en_many}"


def _superscript(match: re.Match[str]) -> str:
    """A power after a letter, digit or bracket (`x²`, `10⁻³`, `(a+b)²`); after a space, its
    number; after a word of letters (other than `²` and `³`: mc², m²) or after punctuation, a
    footnote mark, which a reader skips."""
    text, start, end = match.string, match.start(), match.end()
    value = _script_number(match["digits"])
    minus = match["sign"] == "⁻"
    power = ("minus " if minus else "") + cardinal(str(value))
    before = text[start - 1] if start else " "
    if before.isspace():
        return _padded(match, power)
    if not (before.isalnum() or before in ")]"):
        return ""
    word = re.search(r"[^\W\d_]+$", text[:start])
    if word and len(word[0]) > 1 and (minus or value not in (2, 3)):
        return ""
    spoken = None if minus else {2: "squared", 3: "cubed"}.get(value)
    after = " " if end < len(text) and text[end].isalnum() else ""
    return f" {spoken or 'to the power of ' + power}{after}"


def _subscript(match: re.Match[str]) -> str:
    sign = {"₋": "minus ", "₊": "plus "}.get(match["sign"] or "", "")
    return _padded(match, sign + cardinal(str(_script_number(match["digits"]))))


def _other_numeral(match: re.Match[str]) -> str:
    if unicodedata.category(match[0]) not in ("Nd", "No", "Nl"):
        return match[0]
    words = numeral(match[0])
    return match[0] if words is None else _padded(match, words)


def _roman_value(numeral_text: str) -> int:
    values = [_ROMAN[c] for c in numeral_text]
    return sum(-v if i + 1 < len(values) and values[i + 1] > v else v
               for i, v in enumerate(values))


def _roman(match: re.Match[str]) -> str:
    numeral_text = match["roman"]
    named = match["ordinal"] or match["cardinal"] == "Mark"
    if named and numeral_text == "I" and re.match(r"\s+[A-Za-z]", match.string[match.end():]):
        return match[0]  # "Mark I think", "Peter I know": after a name, I may be the pronoun
    value = _roman_value(numeral_text)
    if match["ordinal"]:
        return f"{match['ordinal']} the {ordinal(value)}"
    return f"{match['cardinal']} {cardinal(str(value))}"


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
    second = int(match["s"] or "0")
    seconds = f" and {cardinal(str(second))} second{'s' if second != 1 else ''}" if second else ""
    suffix = match["ampm"]
    period = _ampm(match) if suffix else ""
    if minute == 0:
        if suffix:
            return cardinal(str(hour)) + seconds + period
        return ("midnight" if hour in (0, 24) else (
            f"{cardinal(str(hour))} hundred" if hour > 12
            else f"{cardinal(str(hour))} o'clock")) + seconds
    spoken_minute = f"oh {_DIGITS[minute]}" if minute < 10 else cardinal(str(minute))
    return f"{cardinal(str(hour))} {spoken_minute}{seconds}{period}"


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


def _counted(one: str, many: str) -> Callable[[re.Match[str]], str]:
    """`5°`, `50¢`: the number, then what it counts."""
    return lambda m: f"{cardinal(m['n'])} {one if m['n'] in ('1', '-1') else many}"


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


def _alternatives(words: Iterable[str]) -> str:
    """A regex alternation of `words`, longest first (so `w/o` is tried before `w/`)."""
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


_AMPM = r"\s?(?P<ampm>[AaPp])(?:\.\s?[Mm]\.|\s?[Mm]\b)"
_END = r"(?P<end>(?=\s*$)|(?=\s+[A-Z]))?"
_AREAS = _alternatives(_AREA_UNITS)
_UNICODE_RULES: list[Rule] = [
    # `3½`, `⅞`, `3 1⁄2`: a fraction, after its whole number when one stands before it.
    (re.compile(rf"(?:(?<![\d.,])(?P<whole>\d+)\s?)?(?P<frac>[{_VULGAR}])"), _vulgar),
    (re.compile(r"(?:(?<![\d.,])(?P<whole>\d+)\s)?(?<![\d.,])(?P<a>\d+)\u2044(?P<b>\d+)"),
     lambda m: _whole_and_part(m, int(m["a"]), int(m["b"]))),
    # `20 m²`, `1 km2`, `per m²`: an area or a volume.
    (re.compile(rf"(?P<number>{NUMBER})\s?(?P<unit>{_AREAS})(?P<power>[23²³])(?!\w)"), _area),
    (re.compile(rf"(?<![\w.])(?P<unit>{_AREAS})(?P<power>[²³])(?!\w)"), _area),
    (re.compile(rf"(?P<sign>[⁻⁺])?(?P<digits>[{_SUPERSCRIPTS}]+)"), _superscript),
    (re.compile(rf"(?P<sign>[₋₊])?(?P<digits>[{_SUBSCRIPTS}]+)"), _subscript),
    (re.compile(r"[^\x00-\x7f]"), _other_numeral),
]
"""Numerals other than ASCII digits (those of other scripts are folded to ASCII before)."""
_RULES: list[Rule] = [
    *_UNICODE_RULES,
    (re.compile(r"\b(?:https?://|www\.)[^\s<>\"]+", re.I), _url),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), _email),
    (re.compile(r"\b(?P<abbr>" + "|".join(_TITLES) + r")\.(?=\s)"), _title),
    (re.compile(r"\b(?P<abbr>" + "|".join(_BEFORE_NAME) + r")\.(?=\s+[A-Z])"), _title),
    (re.compile(r"\b(?P<abbr>" + "|".join(_AFTER_NAME) + r")\." + _END), _after_name),
    (re.compile(r"(?<![\w.])(?P<abbr>" + _alternatives(_WORDS) + r")\." + _END), _word),
    (re.compile(r"\bvs\b"), lambda m: "versus"),
    (re.compile(r"(?<![\w/])(?P<s>w/o|w/)(?=\s)|\b(?P<w>aka|AKA|BTW|IMO|TBD)\b"),
     lambda m: _SHORTHANDS[m["s"] or m["w"]]),
    (re.compile(r"\b(?:(?P<cardinal>" + _alternatives(_ROMAN_CARDINAL) + r")|(?P<ordinal>"
                + _alternatives(_ROMAN_ORDINAL) + r")) (?P<roman>(?=[IVX])(?:XC|XL|L?X{0,3})"
                r"(?:IX|IV|V?I{0,3}))\b(?!\.\w|['’](?!s\b)\w)"), _roman),
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
    (re.compile(r"\bNos\.\s?(?=\d)"), lambda m: "numbers "),
    (re.compile(r"#(?=\d)"), lambda m: "number "),
    (re.compile(r"\b(?P<m>" + "|".join(_MONTH_ABBREVIATIONS) + r")\.(?=\s*\d)"),
     lambda m: _MONTH_ABBREVIATIONS[m["m"]]),
    # A range of amounts, `$5-$10`: "five dollars to ten dollars".
    (re.compile(r"(?<=\d)\s?[–-]\s?(?=(?:US\$|[$€£¥₹₩])\d)"), lambda m: " to "),
    (re.compile(r"(?P<symbol>US\$|[$€£¥₹₩]|\b(?:USD|EUR|GBP|JPY|INR|Rs\.?)(?=\s?\d))\s?"
                r"(?P<amount>" + NUMBER + r")"
                r"(?:\s?(?P<scale>mn|bn|[kKmMbBtT]\b|(?:thousand|million|billion|trillion)\b))?"),
     _money),
    (re.compile(r"(?P<n>" + NUMBER + r")\s?¢"), _counted("cent", "cents")),
    (re.compile(r"(?P<n>-?" + NUMBER + r")\s?%"), lambda m: f"{cardinal(m['n'])} percent"),
    (re.compile(r"(?<=\d:\d\d)\s?[–-]\s?(?=\d{1,2}:\d\d)"), lambda m: " to "),
    (re.compile(r"\b(?P<h>[01]?\d|2[0-4]):(?P<m>[0-5]\d)(?::(?P<s>[0-5]\d))?\b(?!:\d)(?:"
                + _AMPM + ")?"), _time),
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
    (re.compile(r"(?P<n>" + NUMBER + r")\s?°"), _counted("degree", "degrees")),
    (re.compile(r"\b(?P<n>\d+)(?:st|nd|rd|th)\b"), lambda m: ordinal(int(m["n"]))),
    (re.compile(r"\b(?P<y>(?:1[1-9]|20)\d0)s\b"), lambda m: _plural(year(int(m["y"])))),
    (re.compile(r"(?:(?<![\d.,])'|(?<![\w.,'$]))(?P<d>[2-9]0)s\b"),
     lambda m: _plural(cardinal(m["d"]))),
    (re.compile(r"(?<![\d.,$])\b(?P<y>1[1-9]\d\d|20\d\d)\b(?![.,]\d|%)"),
     lambda m: year(int(m["y"]))),
    (re.compile(r"\b(?P<n>\d+)(?P<letters>[A-Z]{1,3})\b"),
     lambda m: f"{cardinal(m['n'])} {' '.join(m['letters'])}"),
    (re.compile(r"(?<![\w~])~\s?(?=\d)"), lambda m: "about "),
    (re.compile(r"(?<!\d)" + NUMBER + r"(?!\d)"), lambda m: _padded(m, cardinal(m[0]))),
    (re.compile(r"\s&\s"), lambda m: " and "),
    (re.compile("[" + "".join(_SYMBOL_WORDS) + "]"), lambda m: _padded(m, _SYMBOL_WORDS[m[0]])),
    (re.compile(r"(?<=[\w)])\s?\^\s?(?=[\w(])"), lambda m: " to the power of "),
    (re.compile(r"(?<=\s)\+(?=\s)"), lambda m: "plus"),
    (re.compile(r"(?<=\s)=(?=\s)"), lambda m: "equals"),
]


_SPACES = re.compile(r"[ \t]{2,}")


def normalize(text: str) -> str:
    """English text with its numbers, symbols and abbreviations written as spoken words."""
    return normalize_spanned(Spanned.of(text)).text


def normalize_spanned(text: Spanned) -> Spanned:
    """`normalize`, each character remembering the span of the input it stands for."""
    text = apply_rules(text.fold(fold_width).fold(fold_alnum), _RULES)
    return text.sub(_SPACES, lambda m: " ")
