"""SSML in: the subset VoxMux speaks, compiled to plain text that remembers where it came from.

A `<speak>` document becomes `Compiled`: the text the engines read (a `phoneme` as an inline
`[word](/ipa/)` reading, a `say-as` or `sub` as the words they stand for), each character with
the span of the SSML it was made from (so timings point into what the client sent), the breaks
(silences that replace the natural pause where they stand), the tempo and pitch of each stretch
of text (`prosody rate`, `prosody pitch`), the stretches read by another voice or in another
language (`voice`, `lang`), what each read span was read as (the normalization report) and
warnings for what is accepted but not rendered. The parser is expat with no DTD allowed: no
entity can be declared, so none expands (no "billion laughs", no external files).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from xml.parsers import expat

from engines.base import InvalidParameter
from engines.frontend import en
from engines.frontend.spans import Spanned
from engines.frontend.width import fold_alnum

INPUT_FORMATS = ("text", "ssml")

BREAK_STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.4, "strong": 0.7,
                   "x-strong": 1.2}
"""Seconds of silence for each `break strength`."""
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25,
         "x-fast": 1.75}
PITCHES = {"x-low": 0.75, "low": 0.88, "medium": 1.0, "default": 1.0, "high": 1.12,
           "x-high": 1.25}
"""Pitch factor for each named `prosody pitch` level."""
SAY_AS = ("characters", "spell-out", "cardinal", "number", "ordinal", "digits", "telephone",
          "date", "time", "currency")
MAX_BREAK_S = 10.0
LANGUAGE_TAG = re.compile(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8}){0,3}")

_SPOKEN = {"speak", "p", "s", "sub", "say-as", "phoneme", "break", "prosody", "emphasis", "audio",
           "voice", "lang"}


class SSMLError(InvalidParameter):
    """The input is not SSML VoxMux can read; the message names the line and column."""


def detect(text: str, input_format: str | None = None) -> bool:
    """Whether `text` is SSML: asked for, or it starts with `<speak` (after an XML header)."""
    if input_format is not None:
        if input_format not in INPUT_FORMATS:
            raise InvalidParameter("'input_format' must be 'text' or 'ssml'",
                                   param="input_format")
        return input_format == "ssml"
    head = re.sub(r"^\s*(<\?xml[^>]*\?>)?\s*", "", text[:200])
    return head.startswith("<speak")


@dataclass(frozen=True)
class Reading:
    """One span of the input and what it was read as (the normalization report)."""

    start: int
    end: int
    text: str
    read_as: str
    by: str
    """`say-as:<kind>`, `sub`, `phoneme`, `lexicon`."""

    def as_dict(self) -> dict[str, object]:
        return {"start": self.start, "end": self.end, "text": self.text,
                "read_as": self.read_as, "by": self.by}


@dataclass
class Compiled:
    spoken: Spanned
    """The text the engines read; each character's span in the SSML source."""
    breaks: dict[int, float] = field(default_factory=dict)
    """Offset in `spoken.text` -> seconds of silence there."""
    rates: list[tuple[int, int, float]] = field(default_factory=list)
    """(start, end, tempo) stretches of `spoken.text` read at another tempo."""
    pitches: list[tuple[int, int, float]] = field(default_factory=list)
    """(start, end, factor) stretches of `spoken.text` read at another pitch."""
    voices: list[tuple[int, int, str]] = field(default_factory=list)
    """(start, end, name) stretches read by the voice `<voice name>` named (resolved later)."""
    languages: list[tuple[int, int, str]] = field(default_factory=list)
    """(start, end, language) stretches `<lang xml:lang>` marks as another language."""
    readings: list[Reading] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.spoken.text


def _seconds(value: str) -> float | None:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*", value)
    if match is None:
        return None
    number = float(match[1])
    return number / 1000 if match[2] == "ms" else number


def _pitch(value: str) -> float | None:
    """A `prosody pitch` as a factor: a level, `+20%` / `-10%`, or `+2st` (semitones); Hz
    values need the voice's own pitch, which no engine reports, so they are refused."""
    value = value.strip()
    if value in PITCHES:
        return PITCHES[value]
    match = re.fullmatch(r"([+-]\d+(?:\.\d+)?)(%|st)", value)
    if match is None:
        return None
    number = float(match[1])
    factor = 1 + number / 100 if match[2] == "%" else 2 ** (number / 12)
    return factor if 0.5 <= factor <= 2.0 else None


def _rate(value: str) -> float | None:
    value = value.strip()
    if value in RATES:
        return RATES[value]
    match = re.fullmatch(r"([+-]?\d+(?:\.\d+)?)(%?)", value)
    if match is None:
        return None
    number = float(match[1])
    if match[2]:
        number = 1 + number / 100 if match[1][0] in "+-" else number / 100
    return number if 0.25 <= number <= 4.0 else None


def _characters(text: str) -> str:
    """Each letter as itself, each numeral by its value (`x²`: X two, `½`: one half)."""
    return " ".join(c.upper() if c.isalpha() else en.numeral(c) or c for c in text
                    if c.isalnum())


def _date(text: str, fmt: str) -> str | None:
    parts = [p for p in re.split(r"[-/.\s]+", text.strip()) if p]
    order = (fmt or "ymd").lower()
    if len(parts) != len(order) or not all(p.isdecimal() for p in parts):
        return None
    value = dict(zip(order, parts, strict=True))
    month, day = int(value.get("m", "1")), int(value.get("d", "1"))
    if not 1 <= month <= 12 or not 1 <= day <= 31:
        return None
    if "d" not in value:
        return f"{en.MONTHS[month - 1]} {en.year(int(value['y']))}"
    return en._date(month, day, value.get("y"))


def say_as(kind: str, text: str, fmt: str = "") -> str | None:
    """What `text` reads as for `say-as interpret-as=kind`; None when it does not fit.

    Digits of any script are read by their value; a number is made of decimal digits only
    (`int` reads those; `²` and `①` have a digit value but are no decimal digit)."""
    stripped = fold_alnum(text.strip())
    number = stripped.replace(",", "")
    if kind in ("characters", "spell-out"):
        return _characters(stripped)
    if kind == "digits":
        return en.digits(stripped) if any(c.isdigit() for c in stripped) else None
    if kind in ("cardinal", "number"):
        return en.cardinal(number) if re.fullmatch(r"-?\d+(\.\d+)?", number) else None
    if kind == "ordinal":
        digits = re.sub(r"(st|nd|rd|th)$", "", number)
        return en.ordinal(int(digits)) if digits.isdecimal() else None
    if kind == "telephone":
        groups = re.findall(r"\d+", stripped)
        if not groups:
            return None
        spoken = en._digit_groups(groups)
        return ("plus " + spoken) if stripped.startswith("+") else spoken
    if kind == "date":
        return _date(stripped, fmt)
    if kind in ("time", "currency"):
        spoken = en.normalize(stripped)
        return spoken if not any(c.isdigit() for c in spoken) else None
    return None


class _Compiler:
    def __init__(self, source: str) -> None:
        self.source = source
        self.raw = source.encode()
        self._char_at = _ByteMap(source)
        # The document arrives as text (JSON carried it as UTF-8): its bytes are the UTF-8
        # encoding of that text, whatever an `<?xml encoding=...?>` declaration says.
        self.parser = expat.ParserCreate("UTF-8")
        self.parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self.parser.StartDoctypeDeclHandler = self._doctype
        self.parser.EntityDeclHandler = self._doctype
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.CharacterDataHandler = self._data
        self.out = Compiled(Spanned("", (), ()))
        self.stack: list[tuple[str, dict[str, str], int, int]] = []
        """Open elements: (name, attributes, source start of content, output start)."""
        self.capture: list[Spanned] | None = None
        """Text inside an element that replaces its content (say-as, sub, phoneme)."""
        self.warned: set[str] = set()

    def _where(self) -> str:
        return f"line {self.parser.CurrentLineNumber}, column {self.parser.CurrentColumnNumber + 1}"

    def _error(self, message: str) -> SSMLError:
        return SSMLError(f"Invalid SSML at {self._where()}: {message}", param="input",
                         code="invalid_ssml")

    def _warn(self, message: str) -> None:
        if message not in self.warned:
            self.warned.add(message)
            self.out.warnings.append(message)

    def _doctype(self, *_: object) -> None:
        raise self._error("a DOCTYPE or entity declaration is not allowed in SSML")

    def _position(self) -> int:
        return self._char_at(self.parser.CurrentByteIndex)

    def _emit(self, text: Spanned) -> None:
        if self.capture is not None:
            self.capture.append(text)
        else:
            self.out.spoken = self.out.spoken + text

    def _emit_at(self, text: str, at: int) -> None:
        self._emit(Spanned.made_from(text, at, at))

    def _data(self, data: str) -> None:
        start = self._position()
        if not self.stack:
            return
        encoded = data.encode()
        byte = self.parser.CurrentByteIndex
        if self.raw[byte:byte + len(encoded)] == encoded:
            self._emit(Spanned.of(data, start))
        else:  # an entity or character reference (`&amp;`), or a normalized line end
            end = self.source.find(";", start)
            self._emit(Spanned.made_from(data, start, end + 1 if end >= 0 else start + 1))

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        tag = name.rpartition(":")[2] if ":" in name and not name.startswith("xml") else name
        if not self.stack and tag != "speak":
            raise self._error(f"the root element must be <speak>, not <{name}>")
        at = self._position()
        content = self.source.find(">", at) + 1
        if tag == "break":
            self._break(attrs)
        elif tag in ("say-as", "sub", "phoneme"):
            if self.capture is not None:
                raise self._error(f"<{tag}> cannot be inside another say-as, sub or phoneme")
            self._check_replacing(tag, attrs)
            self.capture = []
        elif tag == "prosody":
            for key in attrs:
                if key not in ("rate", "pitch"):
                    self._warn(f"prosody {key} is not rendered; the text is read at its "
                               "own " + key)
            if "rate" in attrs and _rate(attrs["rate"]) is None:
                raise self._error(f"prosody rate '{attrs['rate']}' is not x-slow, slow, "
                                  "medium, fast, x-fast or a percentage from 25% to 400%")
            if "pitch" in attrs and _pitch(attrs["pitch"]) is None:
                raise self._error(f"prosody pitch '{attrs['pitch']}' is not x-low, low, medium, "
                                  "high, x-high, a change like +20% or -3st (half to twice "
                                  "the voice's pitch)")
        elif tag in ("emphasis", "audio", "mark"):
            self._warn(f"<{tag}> is accepted but not rendered" + (
                "; its text is read" if tag != "mark" else ""))
        elif tag == "voice" and not attrs.get("name", "").strip():
            self._warn("<voice> without a name is not rendered: the request's voice reads it")
        elif tag == "lang":
            code = attrs.get("xml:lang", "").strip()
            if not code:
                raise self._error("<lang> needs an xml:lang attribute")
            if not LANGUAGE_TAG.fullmatch(code):
                raise self._error(f"xml:lang {code[:40]!r} is not a language tag like fr or "
                                  "fr-FR")
        elif tag not in _SPOKEN:
            self._warn(f"<{tag}> is not part of VoxMux's SSML; its text is read")
        self.stack.append((tag, attrs, content, len(self.out.spoken)))

    def _check_replacing(self, tag: str, attrs: dict[str, str]) -> None:
        if tag == "say-as":
            kind = attrs.get("interpret-as", "")
            if kind not in SAY_AS:
                raise self._error(f"say-as interpret-as '{kind}' is not one of "
                                  + ", ".join(SAY_AS))
        elif tag == "sub" and "alias" not in attrs:
            raise self._error("<sub> needs an alias attribute")
        elif tag == "phoneme":
            if "ph" not in attrs:
                raise self._error("<phoneme> needs a ph attribute")
            alphabet = attrs.get("alphabet", "ipa")
            if alphabet != "ipa":
                self._warn(f"phoneme alphabet '{alphabet}' is not supported (only ipa): "
                           "its text is read as written")

    def _break(self, attrs: dict[str, str]) -> None:
        if "time" in attrs:
            seconds = _seconds(attrs["time"])
            if seconds is None or seconds > MAX_BREAK_S:
                raise self._error(f"break time '{attrs['time']}' is not a duration like 500ms "
                                  f"or 1.5s (at most {MAX_BREAK_S:g}s)")
        else:
            strength = attrs.get("strength", "medium")
            if strength not in BREAK_STRENGTHS:
                raise self._error(f"break strength '{strength}' is not one of "
                                  + ", ".join(BREAK_STRENGTHS))
            seconds = BREAK_STRENGTHS[strength]
        if self.capture is not None:
            raise self._error("<break> cannot be inside say-as, sub or phoneme")
        at = len(self.out.spoken)
        self.out.breaks[at] = self.out.breaks.get(at, 0.0) + seconds

    def _end(self, name: str) -> None:
        tag, attrs, content, output_start = self.stack.pop()
        end = self._position()
        if tag in ("say-as", "sub", "phoneme"):
            self._replace(tag, attrs, content, end)
        elif tag == "s":
            self._close_sentence(end)
        elif tag == "p":
            self._close_sentence(end)
            self._emit_at("\n\n", end)
        elif tag == "prosody":
            rate = _rate(attrs.get("rate", "medium"))
            if rate is not None and rate != 1.0:
                self.out.rates.append((output_start, len(self.out.spoken), rate))
            pitch = _pitch(attrs.get("pitch", "medium"))
            if pitch is not None and pitch != 1.0:
                self.out.pitches.append((output_start, len(self.out.spoken), pitch))
        elif tag == "voice" and attrs.get("name", "").strip():
            self.out.voices.append((output_start, len(self.out.spoken), attrs["name"].strip()))
        elif tag == "lang":
            self.out.languages.append((output_start, len(self.out.spoken),
                                       attrs["xml:lang"].strip().lower()))

    def _close_sentence(self, at: int) -> None:
        text = self.out.spoken.text.rstrip()
        if text and text[-1] not in ".!?…。！？":
            self._emit_at(".", at)
        self._emit_at(" ", at)

    def _replace(self, tag: str, attrs: dict[str, str], start: int, end: int) -> None:
        pieces, self.capture = self.capture or [], None
        inner = Spanned("", (), ())
        for piece in pieces:
            inner = inner + piece
        written = inner.text
        low, high = (inner.source_span(0, len(inner)) if len(inner) else (start, start))
        if tag == "sub":
            spoken = " ".join(attrs["alias"].split())
            read_as = spoken
        elif tag == "phoneme":
            if attrs.get("alphabet", "ipa") != "ipa":
                self._emit(inner)
                return
            ipa = attrs["ph"].strip().strip("/")
            word = " ".join(written.split()) or "_"
            spoken, read_as = f"[{word}](/{ipa}/)", f"/{ipa}/"
        else:
            kind = attrs["interpret-as"]
            said = say_as(kind, written, attrs.get("format", ""))
            if said is None:
                raise self._error(f"'{written.strip()}' cannot be read as say-as {kind}")
            spoken = read_as = said
            tag = f"say-as:{kind}"
        self.out.readings.append(Reading(low, high, self.source[low:high], read_as, tag))
        self._emit(Spanned.made_from(f" {spoken} ", low, high))

    def run(self) -> Compiled:
        try:
            self.parser.Parse(self.raw, True)
        except expat.ExpatError as exc:
            raise SSMLError(
                f"Malformed SSML at line {exc.lineno}, column {exc.offset + 1}: "
                f"{expat.ErrorString(exc.code)}", param="input", code="invalid_ssml") from exc
        return self.out


class _ByteMap:
    """UTF-8 byte offsets (expat's positions) to character offsets of the source."""

    def __init__(self, text: str) -> None:
        self._ascii = text.isascii()
        self._starts: list[int] = []
        if not self._ascii:
            position = 0
            for char in text:
                self._starts.append(position)
                position += len(char.encode())
            self._starts.append(position)

    def __call__(self, byte: int) -> int:
        if self._ascii or byte < 0:
            return max(byte, 0)
        return bisect.bisect_left(self._starts, byte)


def compile_ssml(source: str) -> Compiled:
    """`source` (a `<speak>` document) compiled; raises `SSMLError` naming line and column."""
    return _Compiler(source).run()
