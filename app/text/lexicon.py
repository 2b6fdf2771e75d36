"""Lexicons: how a word is said, per language and optionally per model or voice.

An entry maps a word to IPA (written between slashes, `/zˈɪksɔɹ/`) or to a respelling (`jiff`):
the word becomes an inline reading `[word](/ipa/)` or the respelling, spanning the word, so
timings keep the word as written. Entries come from the deployment file (`config/lexicon.toml`)
and from each key's lexicons (`/v1/audio/lexicons`, stored as JSON; PLS imported). A `Lexicon`
is the entries that apply to one request; `digest()` names them for the audio cache.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from xml.parsers import expat

from app.text.ssml import Reading
from engines.base import InvalidParameter
from engines.frontend.ipa import INLINE
from engines.frontend.spans import Spanned


@dataclass(frozen=True)
class Entry:
    word: str
    reading: str
    """`/ipa/` or a respelling."""
    language: str = "en"
    scope: str = ""
    """Empty (every model), a model id, or `model:voice`."""

    @property
    def ipa(self) -> str | None:
        text = self.reading.strip()
        return text[1:-1] if len(text) > 2 and text[0] == text[-1] == "/" else None

    def spoken(self, written: str) -> str:
        ipa = self.ipa
        return f"[{written}](/{ipa}/)" if ipa is not None else self.reading

    def applies(self, language: str, model: str, voice: str) -> bool:
        if self.language.split("-")[0].lower() != language.split("-")[0].lower():
            return False
        return self.scope in ("", model, f"{model}:{voice}")


def check_entry(word: str, reading: str) -> None:
    if not word.strip() or not reading.strip() or len(word) > 100 or len(reading) > 200:
        raise InvalidParameter("a lexicon entry needs a word and a reading (IPA between "
                               "slashes or a respelling), each at most 100/200 characters",
                               param="entries")
    if re.search(r"[\[\]()\n<>]", word + reading):
        raise InvalidParameter(f"lexicon entry '{word}' has brackets or markup in it",
                               param="entries")


class Lexicon:
    """The entries that apply to one request, found in a text the way a reader finds a word:
    at each place a word can begin, the longest entry written there that ends where a word can
    end (never inside an inline reading, `[word](/ipa/)`), case aside.

    Made in milliseconds however many entries there are (a dictionary of the words; a regular
    expression of 20,000 words took seconds to compile), and applied in time bounded by the
    text's length and the number of distinct entry lengths: a few milliseconds for 20,000
    entries over 4,096 characters."""

    def __init__(self, entries: list[Entry]) -> None:
        by_word: dict[str, Entry] = {}
        for entry in entries:  # later sources (a key's own) override earlier ones
            by_word[entry.word.lower()] = entry
        self.entries = sorted(by_word.values(), key=lambda e: -len(e.word))
        self._by_word = by_word
        lengths: dict[str, set[int]] = {}
        for word in by_word:
            lengths.setdefault(word[0], set()).add(len(word))
        self._lengths = {first: sorted(found, reverse=True) for first, found in lengths.items()}
        """First character -> the lengths of the words it begins, longest first."""

    def __bool__(self) -> bool:
        return bool(self.entries)

    def digest(self) -> str:
        """Names the entries: part of the audio cache key."""
        blob = json.dumps(sorted((e.word, e.reading) for e in self.entries), ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def find(self, text: str) -> Iterator[tuple[int, int, Entry]]:
        """Where entries stand in `text`, left to right: (start, end, entry)."""
        if not self._by_word:
            return
        lowered = _lower(text)
        guarded = [m.span() for m in INLINE.finditer(text)]
        size = len(text)
        i = 0
        while i < size:
            lengths = self._lengths.get(lowered[i])
            if lengths is None or (i and _joins(text[i - 1], "[")) or _inside(guarded, i):
                i += 1
                continue
            for length in lengths:
                end = i + length
                if end <= size and (end == size or not _joins(text[end], "]")):
                    entry = self._by_word.get(lowered[i:end])
                    if entry is not None:
                        yield i, end, entry
                        i = end
                        break
            else:
                i += 1

    def apply(self, text: Spanned, source: str, language: str) -> tuple[Spanned, list[Reading]]:
        """`text` with each lexicon word replaced by its reading (outside inline readings)."""
        readings: list[Reading] = []
        edits: list[tuple[int, int, str]] = []
        for begin, stop, entry in self.find(text.text):
            start, end = text.source_span(begin, stop)
            readings.append(Reading(start, end, source[start:end], entry.reading, "lexicon"))
            edits.append((begin, stop, entry.spoken(text.text[begin:stop])))
        return (text.splice(edits) if edits else text), readings


def _lower(text: str) -> str:
    """`text` in lower case, character for character (one whose lower case is longer, `İ`,
    is kept: no entry can match across it)."""
    lowered = text.lower()
    if len(lowered) == len(text):
        return lowered
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _joins(char: str, bracket: str) -> bool:
    """Whether `char` beside an entry would make it part of a longer word (or a reading)."""
    return char.isalnum() or char == "_" or char == bracket


def _inside(spans: list[tuple[int, int]], at: int) -> bool:
    index = bisect.bisect_right(spans, (at, float("inf"))) - 1
    return index >= 0 and spans[index][0] <= at < spans[index][1]


def load_toml(path: Path) -> list[Entry]:
    """The deployment lexicon: `[en]` tables of `word = "/ipa/"` or `word = "respelling"`, with
    nested tables for a model (`[en.kokoro]`) or a voice (`[en."kokoro:jf_alpha"]`)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    entries: list[Entry] = []
    for language, table in data.items():
        if not isinstance(table, dict):
            raise ValueError(f"{path.name}: '{language}' must be a table of words")
        for word, value in table.items():
            if isinstance(value, str):
                check_entry(word, value)
                entries.append(Entry(word, value, language))
            elif isinstance(value, dict):
                for inner, reading in value.items():
                    check_entry(inner, str(reading))
                    entries.append(Entry(inner, str(reading), language, word))
    return entries


_PLS_NS = "http://www.w3.org/2005/01/pronunciation-lexicon"


def parse_pls(document: str) -> tuple[str, dict[str, str]]:
    """A W3C PLS document's language and its entries (`grapheme` -> `/phoneme/` or `alias`)."""
    entries: dict[str, str] = {}
    language = "en"
    stack: list[str] = []
    graphemes: list[str] = []
    text: list[str] = []

    def start(name: str, attrs: dict[str, str]) -> None:
        nonlocal language
        tag = name.rpartition(" ")[2]
        stack.append(tag)
        text.clear()
        if tag == "lexicon":
            language = attrs.get("xml:lang") or attrs.get(
                "http://www.w3.org/XML/1998/namespace lang", "en")
            alphabet = attrs.get("alphabet", "ipa")
            if alphabet != "ipa":
                raise InvalidParameter(f"PLS alphabet '{alphabet}' is not supported (only ipa)",
                                       param="pls")
        elif tag == "lexeme":
            graphemes.clear()

    def end(name: str) -> None:
        tag = stack.pop()
        value = " ".join("".join(text).split())
        if tag == "grapheme" and value:
            graphemes.append(value)
        elif tag in ("phoneme", "alias") and value:
            reading = f"/{value}/" if tag == "phoneme" else value
            for grapheme in graphemes:
                entries.setdefault(grapheme, reading)
        text.clear()

    parser = expat.ParserCreate("UTF-8", namespace_separator=" ")  # (text: see app.text.ssml)
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)

    def refuse(*_: object) -> None:
        raise InvalidParameter("a DOCTYPE is not allowed in a PLS document", param="pls")

    parser.StartDoctypeDeclHandler = refuse
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text.append
    try:
        parser.Parse(document.encode(), True)
    except expat.ExpatError as exc:
        raise InvalidParameter(f"Malformed PLS at line {exc.lineno}, column {exc.offset + 1}: "
                               f"{expat.ErrorString(exc.code)}", param="pls",
                               code="invalid_pls") from exc
    for word, reading in entries.items():
        check_entry(word, reading)
    return language, entries
