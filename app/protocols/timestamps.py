"""Word timings on the wire: the word objects every route sends, ElevenLabs-style character
alignment, and SRT / WebVTT captions (written by pysubs2).

Times are seconds from the start of the response's audio, rounded to the millisecond; spans are
character offsets in the request text (`char_end` exclusive).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import pysubs2

from engines.base import WordTiming

CaptionFormat = Literal["srt", "vtt"]
CAPTION_CHARS = 42
"""Longest caption line: a common subtitling guideline."""
CAPTION_SECONDS = 6.0


def _ms(seconds: float) -> float:
    return round(seconds, 3)


def word_json(word: WordTiming) -> dict[str, Any]:
    """`{"word", "start", "end", "char_start", "char_end"}` (SSE and WebSocket frames)."""
    return {"word": word.word, "start": _ms(word.start), "end": _ms(word.end),
            "char_start": word.char_start, "char_end": word.char_end}


def kokoro_word(word: WordTiming) -> dict[str, Any]:
    """Kokoro-FastAPI's `{"word", "start_time", "end_time"}`."""
    return {"word": word.word, "start_time": _ms(word.start), "end_time": _ms(word.end)}


def alignment(text: str, words: Sequence[WordTiming], start: int = 0, end: int | None = None,
              after: float = 0.0) -> dict[str, list[Any]]:
    """ElevenLabs-style alignment of `text[start:end]`: every character, the ones inside a word
    timed along its phonemes, spaces and punctuation between words spanning the gap; with no
    words, every character at `after` (the end of what came before)."""
    end = len(text) if end is None else end
    times: dict[int, tuple[float, float]] = {}
    for word in words:
        for i, span in enumerate(word.character_times()):
            times[word.char_start + i] = span
    characters: list[str] = []
    starts: list[float] = []
    ends: list[float] = []
    ordered = sorted(words, key=lambda w: w.char_start)
    clock = ordered[0].start if ordered else after
    following = iter(ordered)
    upcoming = next(following, None)
    for i in range(start, end):
        while upcoming is not None and upcoming.char_end <= i:
            upcoming = next(following, None)
        if i in times:
            low, high = times[i]
        else:
            low = clock
            high = max(clock, upcoming.start if upcoming is not None else clock)
        low = max(low, clock)
        high = max(high, low)
        characters.append(text[i])
        starts.append(_ms(low))
        ends.append(_ms(high))
        clock = low if i in times else high
    return {"characters": characters, "character_start_times_seconds": starts,
            "character_end_times_seconds": ends}


def cues(text: str, words: Sequence[WordTiming]) -> list[tuple[float, float, str]]:
    """Caption cues: words in order, a new cue after a sentence end, a line of
    `CAPTION_CHARS` or `CAPTION_SECONDS`; each cue's text is the input it covers."""
    out: list[tuple[float, float, str]] = []
    group: list[WordTiming] = []

    def close() -> None:
        if group:
            first, last = group[0], group[-1]
            stop = last.char_end
            while stop < len(text) and not text[stop].isspace():
                stop += 1  # the punctuation that closes the last word
            out.append((first.start, last.end, " ".join(text[first.char_start:stop].split())))
            group.clear()

    for word in words:
        if group:
            first = group[0]
            longer = word.char_end - first.char_start > CAPTION_CHARS
            if longer or word.end - first.start > CAPTION_SECONDS:
                close()
        group.append(word)
        tail = text[word.char_end:word.char_end + 2]
        if tail[:1] in (".", "!", "?", "。", "！", "？", "…"):
            close()
    close()
    return out


def captions(text: str, words: Iterable[WordTiming], fmt: CaptionFormat) -> str:
    """SRT or WebVTT text for the timed words of `text`."""
    subtitles = pysubs2.SSAFile()
    for start, end, line in cues(text, sorted(words, key=lambda w: w.char_start)):
        event = pysubs2.SSAEvent(start=round(start * 1000), end=round(end * 1000))
        event.plaintext = line  # escaped: braces and backslashes are not markup
        subtitles.append(event)
    return str(subtitles.to_string(fmt))
