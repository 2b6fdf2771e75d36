"""One text splitter for every route: long text for HTTP, streamed LLM tokens for voice agents.

Cut priority: sentence ends (and paragraph breaks), then clause marks, then whitespace, then a
hard cut at the limit. Each sentence is its own segment; pieces with nothing to say ("!", an
emoji) merge into the next one. Nothing is ever dropped: segments are stripped slices of the
input, in order. Punctuation tables live in `app.text.punctuation`.

A whole text (not a stream) may be packed after its short first segment: `split_text(...,
growth=2)` joins neighbouring sentences into segments whose budget doubles each time up to the
engine's limit, so the first audio comes after one short engine call and the rest of the text
costs few, large ones (each engine call has a fixed cost, and the listener already has audio
to hear while they run). `join_kind` says how a segment ends, so the pause after it can match.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterator
from typing import Literal

from app.text import punctuation as P

# Ranks of cut candidates; UNDECIDED means "the next characters are needed to tell". A space
# after a word of one to three letters ("the", "of", "and") ranks below other spaces: a budget
# cut there leaves the word hanging off the end of a segment, spoken with a final fall.
_SENTENCE, _PHRASE, _WEAK, _SPACE, _SPACE_AFTER_SHORT, _UNDECIDED = 5, 4, 3, 2, 1, 0
_SHORT_WORD = 3
MIN_REST = 20
"""Characters of its sentence a first segment cut inside it must leave to the next segment."""


def _marks(kind: str) -> str:
    return "".join(family.get(kind, "") for family in P.FAMILIES.values())


_SPACED_END, _END = _marks("spaced_end"), _marks("end")
_TERMINATORS = frozenset(_SPACED_END + _END)
_SPACED_CLAUSE, _CLAUSE = _marks("spaced_weak"), _marks("weak")
_CLOSERS, _OPENERS = frozenset(P.CLOSERS), frozenset(P.OPENERS)
_ABBREVIATIONS = frozenset(" ".join(P.ABBREVIATIONS.values()).split())
_INITIALS = re.compile(r"(?:[^\W\d_]\.)*[^\W\d_]")  # U.S, e.g, z.B, J
_MARK = re.compile("[" + re.escape(_SPACED_END + _END + _SPACED_CLAUSE + _CLAUSE) + r";\s]")
_TWO_ALNUM = re.compile(r"[^\W_].*?[^\W_]", re.DOTALL)


def normalize_ws(text: str) -> str:
    """Collapse every run of whitespace to one space and strip the ends."""
    return " ".join(text.split())


def _in(char: str, ranges: tuple[tuple[int, int], ...]) -> bool:
    return any(low <= ord(char) <= high for low, high in ranges)


def _speakable(piece: str) -> bool:
    return _TWO_ALNUM.search(piece) is not None


def _is_terminator(text: str, i: int) -> bool:
    if text[i] == ";":  # the Greek question mark, typed as a semicolon
        return i > 0 and _in(text[i - 1], P.GREEK)
    return text[i] in _TERMINATORS


def _skip_closers(text: str, j: int) -> int:
    n = len(text)
    while j < n:
        if text[j] in _CLOSERS:
            j += 1
        elif (  # French `! »`, but not German `. »Neu`, where » opens the next quote
            text[j].isspace()
            and j + 1 < n
            and text[j + 1] in P.SPACED_CLOSERS
            and (j + 2 == n or text[j + 2].isspace())
        ):
            j += 2
        else:
            break
    return j


def _is_abbreviation(text: str, dot: int) -> bool:
    start = dot
    while start > 0 and not text[start - 1].isspace() and text[start - 1] not in _OPENERS:
        start -= 1
    word = text[start:dot]
    if word.isdigit():  # a numbered list item "1. Eggs" starts a line
        return start == 0 or text[start - 1] == "\n"
    return word.lower() in _ABBREVIATIONS or _INITIALS.fullmatch(word) is not None


def _sentence_end(text: str, i: int, j: int, k: int, final: bool) -> bool | None:
    """Whether the terminators text[i:j] (closers up to k) end a sentence; None: unknown yet."""
    if any(char in _END for char in text[i:j]):
        return True
    if k < len(text) and not text[k].isspace():
        return _in(text[k], P.UNSPACED)  # "3.14" and "Yahoo!Inc" no, "OK!次" yes
    if text[i:j] == "." and _is_abbreviation(text, i):
        return False
    m = k
    while m < len(text) and (text[m].isspace() or text[m] in _OPENERS):
        m += 1
    if m == len(text):
        return True if final else None
    return not (text[m].islower() or text[m].isdigit())  # "e.g. the", "p. 5"


def _space_rank(text: str, i: int, j: int) -> int | None:
    gap, after = text[i:j], text[j]
    if gap.count("\n") >= 2:
        return _SENTENCE
    if unicodedata.category(after) in ("Po", "Pe", "Pf") and after not in _OPENERS:
        return None  # keep "Bonjour !" and "Attention :" whole
    if i > 0 and _in(text[i - 1], P.PHRASE_SPACED) and _in(after, P.PHRASE_SPACED):
        return _PHRASE
    if "\n" in gap:
        return _WEAK
    start = i
    while start > 0 and text[start - 1].isalpha():
        start -= 1
    short = 0 < i - start <= _SHORT_WORD and (start == 0 or text[start - 1].isspace())
    return _SPACE_AFTER_SHORT if short else _SPACE


def _boundaries(text: str, limit: int, final: bool) -> Iterator[tuple[int, int]]:
    """Yield (cut, rank) for every place up to `limit` where `text` could be cut."""
    n, i = len(text), 0
    while (match := _MARK.search(text, i, limit + 1)) is not None:
        i = match.start()
        char = text[i]
        if char.isspace():
            j = i + 1
            while j < n and text[j].isspace():
                j += 1
            if j == n:
                if not final:
                    yield i, _UNDECIDED
                return
            if (rank := _space_rank(text, i, j)) is not None:
                yield i, rank
            i = j
        elif _is_terminator(text, i):
            j = i + 1
            while j < n and text[j] in _TERMINATORS:
                j += 1
            k = _skip_closers(text, j)
            end = _sentence_end(text, i, j, k, final)
            if end is None:
                yield k, _UNDECIDED
                return
            if end:
                yield k, _SENTENCE
            i = k
        else:  # a clause mark
            k = _skip_closers(text, i + 1)
            if char in _CLAUSE or (k < n and text[k].isspace()):
                yield k, _WEAK
            i = k


def _joined(before: str, after: str) -> bool:
    return (
        unicodedata.category(after)[0] == "M"
        or after in "\u200d\ufe0e\ufe0f"
        or before == "\u200d"
        or "\U0001f3fb" <= after <= "\U0001f3ff"
    )


def _hard_cut(text: str, limit: int) -> int:
    cut = limit
    while cut > 1 and _joined(text[cut - 1], text[cut]):  # keep "é", emoji sequences whole
        cut -= 1
    return cut if cut > 1 else limit


def _next_cut(text: str, limit: int, min_chars: int, final: bool) -> int | None:
    """Where the first segment of `text` ends, or None while it may still grow."""
    best: dict[int, int] = {}
    for cut, rank in _boundaries(text, limit, final):
        if cut > limit:
            break
        if rank == _UNDECIDED:
            return None
        if (rank == _SENTENCE and _speakable(text[:cut])) or (rank == _PHRASE and cut >= min_chars):
            return cut
        if cut >= min_chars:
            best[rank] = cut  # the latest of each rank makes the longest segment
    if len(text) <= limit:
        return None
    return best[max(best)] if best else _hard_cut(text, limit)


class IncrementalSplitter:
    """Cuts streamed text (LLM tokens, split anywhere) into segments as soon as each is complete.

    A sentence is complete once what follows its terminator shows it ends there (a space, then
    no lowercase letter or digit); CJK-style terminators complete at once. Text longer than the
    limit is cut at the best boundary within it. The first segment after creation or a flush
    has the shorter `first_max_chars` limit, so the first audio of each utterance comes early.
    """

    def __init__(
        self, *, max_chars: int = 400, first_max_chars: int | None = 150, min_chars: int = 10
    ) -> None:
        if max_chars < 1 or min_chars < 0 or (first_max_chars is not None and first_max_chars < 1):
            raise ValueError("max_chars and first_max_chars must be >= 1 and min_chars >= 0")
        self.max_chars = max_chars
        self.first_max_chars = min(first_max_chars or max_chars, max_chars)
        self.min_chars = min_chars
        self._buffer = ""
        self._first = True

    @property
    def pending(self) -> str:
        """Text received but not yet returned as a segment."""
        return self._buffer

    def feed(self, fragment: str) -> list[str]:
        """Add text; return the segments that are complete now."""
        self._buffer += fragment
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """Return everything buffered as segments, complete or not."""
        segments = self._drain(final=True)
        if rest := self._buffer.strip():
            segments.append(rest)
        self._buffer, self._first = "", True
        return segments

    def _drain(self, final: bool) -> list[str]:
        segments: list[str] = []
        while True:
            self._buffer = self._buffer.lstrip()
            limit = self.first_max_chars if self._first else self.max_chars
            cut = _next_cut(self._buffer, limit, self.min_chars, final)
            if cut is not None and self._first and limit < self.max_chars:
                cut = self._first_cut(cut, final)
            if cut is None:
                return segments
            segments.append(self._buffer[:cut].rstrip())
            self._buffer, self._first = self._buffer[cut:], False

    def _first_cut(self, cut: int, final: bool) -> int | None:
        """A first segment cut inside its sentence keeps the cut only when at least `MIN_REST`
        characters of the sentence follow it: a word or two left alone ("... tomorrow" +
        "morning.") is spoken as an utterance of its own, and listeners (and Whisper) lose it.
        Otherwise the whole sentence is the first segment (within `max_chars`), or, while the
        sentence is still arriving, the cut waits for more text."""
        if join_kind(self._buffer[:cut]) == "sentence":
            return cut
        whole = _next_cut(self._buffer, self.max_chars, self.min_chars, final)
        if whole is None:
            return cut if len(self._buffer) - cut >= MIN_REST else None
        return cut if whole - cut >= MIN_REST else whole


def split_text(
    text: str, *, max_chars: int = 400, first_max_chars: int | None = 150, min_chars: int = 10,
    growth: float = 1.0,
) -> list[str]:
    """Split `text` into stripped, non-empty segments of at most `max_chars` characters.

    The first segment is at most `first_max_chars`. A trailing piece with nothing to say
    ("Done. 🙂") joins the previous segment when it fits. With `growth` > 1 the segments after
    the first are packed (`pack`).
    """
    splitter = IncrementalSplitter(
        max_chars=max_chars, first_max_chars=first_max_chars, min_chars=min_chars
    )
    segments = splitter.feed(text) + splitter.flush()
    if len(segments) > 1 and not _speakable(segments[-1]):
        head = text.rstrip()[: -len(segments[-1])]
        joined = segments[-2] + (" " if head[-1:].isspace() else "") + segments[-1]
        if len(joined) <= (splitter.first_max_chars if len(segments) == 2 else max_chars):
            segments[-2:] = [joined]
    return pack(text, segments, first_max_chars=splitter.first_max_chars, max_chars=max_chars,
                growth=growth)


JoinKind = Literal["sentence", "clause", "word"]


def first_sentence(text: str, max_chars: int) -> str:
    """The first segment `text` would have without a shorter first budget: its first sentence
    (at most `max_chars`)."""
    splitter = IncrementalSplitter(max_chars=max_chars, first_max_chars=max_chars)
    # A segment the splitter gives before the text ends is final: the text is fed a piece at a
    # time and read no further than the first segment needs (not to the end of a long text).
    for start in range(0, len(text), _FIRST_PIECE):
        if segments := splitter.feed(text[start:start + _FIRST_PIECE]):
            return segments[0]
    segments = splitter.flush()
    return segments[0] if segments else ""


_FIRST_PIECE = 128
"""Characters `first_sentence` feeds at a time."""


def join_kind(segment: str) -> JoinKind:
    """How `segment` ends: at a sentence end (or a paragraph), at a clause mark, or between two
    words (a cut made for the budget)."""
    end = len(segment.rstrip())
    while end > 0 and segment[end - 1] in _CLOSERS:
        end -= 1
    if end == 0:
        return "word"
    last = segment[end - 1]
    if last in _TERMINATORS or (last == ";" and end > 1 and _in(segment[end - 2], P.GREEK)):
        return "sentence"
    if last in _SPACED_CLAUSE or last in _CLAUSE or last == ";":
        return "clause"
    return "word"


def segment_offsets(text: str, segments: list[str]) -> list[int]:
    """Where each segment starts in `text`: segments are its slices, in order."""
    offsets: list[int] = []
    position = 0
    for segment in segments:
        found = text.find(segment, position)
        offsets.append(found if found >= 0 else position)
        position = (found if found >= 0 else position) + len(segment)
    return offsets


def _budget(k: int, first_max_chars: int, max_chars: int, growth: float) -> int:
    """The k-th segment's budget: `first_max_chars * growth ** k`, at most `max_chars`."""
    if k == 0:
        return min(first_max_chars, max_chars)
    # Compared in logs first: past ~1,000 segments growth ** k overflows (a book has more), and
    # an infinite growth (`segment_packing = "full"`) is the limit at once.
    if math.log(first_max_chars) + k * math.log(growth) >= math.log(max_chars):
        return max_chars
    return min(max_chars, int(first_max_chars * growth ** k))


def pack(text: str, segments: list[str], *, first_max_chars: int, max_chars: int,
         growth: float) -> list[str]:
    """Join neighbouring segments after the first while the joined slice of `text` fits the
    budget of its place: `first_max_chars * growth ** k` for the k-th segment, at most
    `max_chars` (an infinite `growth`: the limit from the second segment on). When the first
    budget is the limit itself (nothing waits for early audio), the first segment is packed
    too. Joined segments are slices of `text` again (the space between
    kept). A paragraph break is never packed over: it keeps its segment boundary and its pause."""
    whole = first_max_chars >= max_chars
    if growth <= 1 or len(segments) < (2 if whole else 3):
        return segments
    offsets = segment_offsets(text, segments)
    packed = [] if whole else [segments[0]]
    start = end = -1
    first = len(packed)
    for segment, offset in zip(segments[first:], offsets[first:], strict=True):
        budget = _budget(len(packed), first_max_chars, max_chars, growth)
        paragraph = text[end:offset].count("\n") >= 2 if start >= 0 else False
        if start >= 0 and not paragraph and offset + len(segment) - start <= budget:
            end = offset + len(segment)
            continue
        if start >= 0:
            packed.append(text[start:end])
        start, end = offset, offset + len(segment)
    packed.append(text[start:end])
    return packed
