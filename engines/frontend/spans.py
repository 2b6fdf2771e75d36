"""Text that remembers where each of its characters came from.

Normalization rewrites text ("42" -> "forty-two", "Dr." -> "Doctor"); word timings must still
name the span of the input a spoken word stands for. `Spanned` carries, for every character of
the current text, the span of the source it was made from: a kept character its own position, a
replacement every source character its match covered. `sub` works for any rule of the
(pattern, replacer) kind, so new rules keep spans without doing anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

Replacer = Callable[[re.Match[str]], str]


@dataclass(frozen=True)
class Spanned:
    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    """`text[i]` was made from `source[starts[i]:ends[i]]`."""

    @classmethod
    def of(cls, text: str, offset: int = 0) -> Spanned:
        """Text that is its own source (from `offset` on)."""
        starts = tuple(range(offset, offset + len(text)))
        return cls(text, starts, tuple(i + 1 for i in starts))

    @classmethod
    def made_from(cls, text: str, start: int, end: int) -> Spanned:
        """Text made as a whole from `source[start:end]` (a reading in another script)."""
        return cls(text, (start,) * len(text), (end,) * len(text))

    def __len__(self) -> int:
        return len(self.text)

    def __add__(self, other: Spanned) -> Spanned:
        return Spanned(self.text + other.text, self.starts + other.starts, self.ends + other.ends)

    def __getitem__(self, key: slice) -> Spanned:
        return Spanned(self.text[key], self.starts[key], self.ends[key])

    def runs(self) -> list[tuple[int, int, int, int]]:
        """The spans, compactly, for storing: `(count, start, end, step)` runs, in which the
        k-th character spans `start + step * k` to `end + step * k` (step 1 for characters
        kept from the source, 0 for a replacement). A text read as written is one run."""
        runs: list[tuple[int, int, int, int]] = []
        for start, end in zip(self.starts, self.ends, strict=True):
            if runs:
                count, first, last, step = runs[-1]
                if count == 1 and (start, end) in ((first + 1, last + 1), (first, last)):
                    runs[-1] = (2, first, last, start - first)
                    continue
                if count > 1 and (start, end) == (first + step * count, last + step * count):
                    runs[-1] = (count + 1, first, last, step)
                    continue
            runs.append((1, start, end, 1))
        return runs

    @classmethod
    def from_runs(cls, text: str, runs: list[tuple[int, int, int, int]]) -> Spanned:
        """The `Spanned` whose `runs()` these are."""
        starts: list[int] = []
        ends: list[int] = []
        for count, start, end, step in runs:
            starts.extend(start + step * k for k in range(count))
            ends.extend(end + step * k for k in range(count))
        if len(starts) != len(text):
            raise ValueError(f"{len(starts)} spans for {len(text)} characters")
        return cls(text, tuple(starts), tuple(ends))

    def source_span(self, i: int, j: int) -> tuple[int, int]:
        """The source span `text[i:j]` was made from; an empty piece is where it would stand."""
        if j > i:
            return min(self.starts[i:j]), max(self.ends[i:j])
        at = self._point(i)
        return at, at

    def _point(self, i: int) -> int:
        if i < len(self.starts):
            return self.starts[i]
        return self.ends[-1] if self.ends else 0

    def sub(self, pattern: re.Pattern[str], replace: Replacer) -> Spanned:
        """`pattern.sub(replace, text)`, with each replacement spanning what its match did."""
        return self.splice((match.start(), match.end(), replace(match))
                           for match in pattern.finditer(self.text))

    def splice(self, edits: Iterable[tuple[int, int, str]]) -> Spanned:
        """Each `(begin, stop, replacement)`, in order and not overlapping, put in place of
        `text[begin:stop]`, spanning what that piece did; a piece kept as it was keeps its
        own spans."""
        text, starts, ends = self.text, self.starts, self.ends
        out: list[str] = []
        new_starts: list[int] = []
        new_ends: list[int] = []
        position = 0
        for begin, stop, replacement in edits:
            if replacement == text[begin:stop]:
                continue  # kept as it was: the characters keep their own spans
            out.append(text[position:begin])
            new_starts.extend(starts[position:begin])
            new_ends.extend(ends[position:begin])
            low, high = self.source_span(begin, stop)
            out.append(replacement)
            new_starts.extend([low] * len(replacement))
            new_ends.extend([high] * len(replacement))
            position = stop
        if not out:
            return self
        out.append(text[position:])
        new_starts.extend(starts[position:])
        new_ends.extend(ends[position:])
        return Spanned("".join(out), tuple(new_starts), tuple(new_ends))

    def fold(self, convert: Callable[[str], str]) -> Spanned:
        """`convert` applied to the whole text; it must map characters one to one (width
        folding), else it is applied character by character."""
        folded = convert(self.text)
        if len(folded) == len(self.text):
            return Spanned(folded, self.starts, self.ends)
        return self.map_chars(convert)

    def map_chars(self, convert: Callable[[str], str]) -> Spanned:
        """Each character replaced by `convert(char)` (any length), spanning the original."""
        pieces = [convert(c) for c in self.text]
        if all(len(p) == 1 for p in pieces):
            return Spanned("".join(pieces), self.starts, self.ends)
        starts = tuple(s for p, s in zip(pieces, self.starts, strict=True) for _ in p)
        ends = tuple(e for p, e in zip(pieces, self.ends, strict=True) for _ in p)
        return Spanned("".join(pieces), starts, ends)


def apply_rules(text: Spanned, rules: list[tuple[re.Pattern[str], Replacer]]) -> Spanned:
    for pattern, replace in rules:
        text = text.sub(pattern, replace)
    return text
