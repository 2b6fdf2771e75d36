"""Word timings from what an engine already knows: which model unit (a phoneme token, a phoneme
event) belongs to which word, and when each unit is heard.

The neural engines phonemize a whole run of text at once, so eSpeak NG may join words ("of the"
-> `ʌvðə`) or reduce them (`tə` for "to"). `owners` finds each phoneme's word by aligning the
run's phonemes with the phonemes of its words read one by one (difflib, character by
character); punctuation and spaces belong to no word (they are pauses). `timings` then turns
units with owners and times into one `WordTiming` per word of the input: words made from the
same input span (a number "42" spoken "forty-two") become one, with the span of "42".
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher

import numpy as np
import numpy.typing as npt

from engines.base import WordTiming
from engines.frontend.detect import base_language
from engines.frontend.spans import Spanned

_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_HAN = re.compile(r"[\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Word:
    text: str
    """The word as the engine reads it (normalized)."""
    start: int
    end: int
    """Its span in the request text."""


@dataclass(frozen=True)
class Unit:
    """A model unit (token, phoneme) with the word it belongs to (-1: none, a pause)."""

    owner: int
    start: float
    end: float


def words_of(run: Spanned, language: str, split: Callable[[str], list[str]] | None = None
             ) -> list[Word]:
    """The words of a normalized run: letters and digits (with inner apostrophes); Chinese
    further cut into words by `split` (jieba), Japanese kept in phrases between punctuation."""
    words: list[Word] = []
    for match in _WORD.finditer(run.text):
        pieces = [match[0]]
        if split is not None and base_language(language) == "zh" and _HAN.search(match[0]):
            pieces = [p for p in split(match[0]) if p] or pieces
        position = match.start()
        for piece in pieces:
            start, end = run.source_span(position, position + len(piece))
            words.append(Word(piece, start, end))
            position += len(piece)
    return words


def _silent(char: str) -> bool:
    return char.isspace() or unicodedata.category(char)[0] in "PZ"


def owners(phonemes: str, pieces: Sequence[str]) -> list[int]:
    """For each character of `phonemes`, the index of the word whose `pieces[i]` (its phonemes
    read alone) it belongs to; -1 for spaces and punctuation."""
    joined = "".join(pieces)
    owner_of = [i for i, piece in enumerate(pieces) for _ in piece]
    found = [-1] * len(phonemes)
    matcher = SequenceMatcher(None, joined, phonemes, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for k in range(size):
            if not _silent(phonemes[b + k]):
                found[b + k] = owner_of[a + k]
    # Unmatched phonemes join a word beside them: the one before in the same phoneme word, else
    # the one after, else (a phoneme word nothing matched) the nearest before.
    result = list(found)
    for start, end in _spans_between_silence(phonemes):
        inside = [found[i] for i in range(start, end) if found[i] >= 0]
        last = inside[0] if inside else _before(result, start)
        for i in range(start, end):
            if found[i] >= 0:
                last = found[i]
            result[i] = last
    return result


def _before(result: list[int], index: int) -> int:
    for i in range(index - 1, -1, -1):
        if result[i] >= 0:
            return result[i]
    return 0


def _spans_between_silence(text: str) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    start = None
    for i, char in enumerate(text):
        if _silent(char):
            if start is not None:
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    if start is not None:
        spans.append((start, len(text)))
    return spans


def timings(source: str, words: Sequence[Word], units: Sequence[Unit]) -> tuple[WordTiming, ...]:
    """One timing per input word: words from overlapping input spans merged, each word from
    its units' times, characters interpolated along those units."""
    if not words:
        return ()
    by_word: list[list[Unit]] = [[] for _ in words]
    for unit in units:
        if 0 <= unit.owner < len(words):
            by_word[unit.owner].append(unit)
    _share_unvoiced(words, by_word)
    groups: list[tuple[int, int, list[Unit]]] = []
    for word, own in zip(words, by_word, strict=True):
        start, end = _trimmed(source, word.start, word.end)
        if end <= start:
            continue
        if groups and start < groups[-1][1]:
            low, high, merged = groups[-1]
            groups[-1] = (low, max(high, end), merged + own)
        else:
            groups.append((start, end, list(own)))
    out: list[WordTiming] = []
    clock = 0.0
    for start, end, own in groups:
        own.sort(key=lambda u: u.start)
        if own:
            begin, finish = own[0].start, max(u.end for u in own)
        else:
            begin = finish = clock
        begin, finish = max(begin, clock), max(finish, clock, begin)
        text = source[start:end]
        out.append(WordTiming(text, begin, finish, start, end, _char_bounds(len(text), own,
                                                                             begin, finish)))
        clock = finish
    return tuple(out)


def _share_unvoiced(words: Sequence[Word], by_word: list[list[Unit]]) -> None:
    """A word that got no units (eSpeak reads "forty-two" as one word) shares the units of the
    voiced word before it, by length."""
    i = 0
    while i < len(words):
        if by_word[i] or i == 0 or not by_word[i - 1]:
            i += 1
            continue
        j = i
        while j < len(words) and not by_word[j]:
            j += 1
        group = list(range(i - 1, j))
        units = by_word[i - 1]
        begin, finish = units[0].start, max(u.end for u in units)
        lengths = np.cumsum([0] + [len(words[k].text) for k in group], dtype=np.float64)
        cuts = begin + (finish - begin) * lengths / lengths[-1]
        for n, k in enumerate(group):
            by_word[k] = [Unit(k, float(cuts[n]), float(cuts[n + 1]))]
        i = j


def _trimmed(source: str, start: int, end: int) -> tuple[int, int]:
    while start < end and source[start].isspace():
        start += 1
    while end > start and source[end - 1].isspace():
        end -= 1
    return start, end


def _char_bounds(count: int, units: Sequence[Unit], begin: float, finish: float
                 ) -> tuple[float, ...]:
    if not units:
        return tuple(np.linspace(begin, finish, count + 1).tolist())
    axis = [u.start for u in units] + [units[-1].end]
    axis = np.maximum.accumulate(np.clip(axis, begin, finish)).tolist()
    positions = np.linspace(0, len(units), count + 1)
    return tuple(float(t) for t in np.interp(positions, np.arange(len(units) + 1), axis))


def units_from_durations(owner_per_unit: Sequence[int],
                         samples_per_unit: Sequence[float] | npt.NDArray[np.float64],
                         rate: int, offset: float = 0.0) -> list[Unit]:
    """Units from per-unit lengths in samples (a duration tensor times its hop)."""
    bounds = np.concatenate(([0.0], np.cumsum(samples_per_unit, dtype=np.float64))) / rate
    return [Unit(owner, offset + float(bounds[k]), offset + float(bounds[k + 1]))
            for k, owner in enumerate(owner_per_unit)]
