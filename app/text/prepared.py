"""A request's text as the engines will read it: SSML compiled, lexicon entries applied, cut into
segments at breaks and changes of tempo, pitch, voice or language, every character still
pointing into what the client sent.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from app.text.lexicon import Lexicon
from app.text.split import segment_offsets
from app.text.ssml import Compiled, Reading, compile_ssml, detect
from engines.frontend.spans import Spanned

T = TypeVar("T")

_TAG = re.compile(r"<[^>]*>")


@dataclass
class Prepared:
    source: str
    """The client's text (SSML and all)."""
    compiled: Compiled
    markup: bool = False
    """Whether `source` is SSML (else a plain text a lexicon changed)."""

    @property
    def text(self) -> str:
        return self.compiled.text

    @property
    def display(self) -> str:
        """`source` with its markup blanked (same length): captions quote it."""
        return blank_markup(self.source) if self.markup else self.source

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of `source` that `text[start:end]` was made from."""
        spoken = self.compiled.spoken
        return spoken.source_span(min(start, len(spoken)), min(end, len(spoken)))

    @property
    def report(self) -> list[dict[str, object]]:
        return [r.as_dict() for r in sorted(self.compiled.readings, key=lambda r: r.start)]


def prepare(text: str, *, input_format: str | None = None, lexicon: Lexicon | None = None,
            language: str = "en") -> Prepared:
    """`text` compiled (SSML when it is) and with `lexicon` applied."""
    markup = detect(text, input_format)
    compiled = compile_ssml(text) if markup else Compiled(Spanned.of(text))
    if lexicon is not None and lexicon:
        compiled.spoken, readings = lexicon.apply(compiled.spoken, text, language)
        compiled.readings += readings
    return Prepared(text, compiled, markup)


def blank_markup(source: str) -> str:
    """An SSML document with its tags blanked (the same length): what its words' spans quote."""
    return _TAG.sub(lambda m: " " * len(m[0]), source)


@dataclass
class Cut:
    segments: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    pauses: dict[int, float] = field(default_factory=dict)
    """Segment index -> seconds of silence after it (a break); index -1: before the first
    segment (breaks before any text)."""
    rates: dict[int, float] = field(default_factory=dict)
    """Segment index -> tempo it is read at (a prosody rate)."""
    pitches: dict[int, float] = field(default_factory=dict)
    """Segment index -> pitch factor it is read at (a prosody pitch)."""
    voices: dict[int, str] = field(default_factory=dict)
    """Segment index -> the voice `<voice name>` asked for, as written."""
    languages: dict[int, str] = field(default_factory=dict)
    """Segment index -> the language `<lang xml:lang>` marks it as."""


def _innermost(spans: list[tuple[int, int, T]], start: int, end: int) -> T | None:
    """The value of the narrowest span holding `[start, end)` (nested elements: the inner wins)."""
    holding = [(e - s, k) for k, (s, e, _) in enumerate(spans) if s <= start and end <= e]
    return spans[min(holding)[1]][2] if holding else None  # an inner element closes first


def cut(prepared: Prepared, split: Callable[[str], list[str]]) -> Cut:
    """Segments of `prepared.text`, cut first at every break and change of tempo, pitch, voice
    or language, then by `split`."""
    compiled = prepared.compiled
    text = compiled.text
    bounds = {0, len(text), *compiled.breaks}
    for start, end, _ in [*compiled.rates, *compiled.pitches, *compiled.voices,
                          *compiled.languages]:
        bounds |= {start, end}
    points = sorted(b for b in bounds if 0 <= b <= len(text))
    result = Cut()
    for a, b in itertools.pairwise(points):
        piece = text[a:b]
        if a in compiled.breaks:  # after the last segment so far (-1: before the first)
            last = len(result.segments) - 1
            result.pauses[last] = result.pauses.get(last, 0.0) + compiled.breaks[a]
        if not any(c.isalnum() for c in piece):
            continue
        segments = split(piece)
        rate = next((r for s, e, r in compiled.rates if s <= a and b <= e), 1.0)
        pitch = _innermost(compiled.pitches, a, b)
        voice = _innermost(compiled.voices, a, b)
        language = _innermost(compiled.languages, a, b)
        for segment, offset in zip(segments, segment_offsets(piece, segments), strict=True):
            index = len(result.segments)
            if rate != 1.0:
                result.rates[index] = rate
            if pitch is not None:
                result.pitches[index] = pitch
            if voice is not None:
                result.voices[index] = voice
            if language is not None:
                result.languages[index] = language
            result.segments.append(segment)
            result.offsets.append(a + offset)
    if len(text) in compiled.breaks:
        last = len(result.segments) - 1
        result.pauses[last] = result.pauses.get(last, 0.0) + compiled.breaks[len(text)]
    return result


__all__ = ["Cut", "Prepared", "Reading", "blank_markup", "cut", "prepare"]
