"""An audiobook file: AAC in MP4 (`.m4b`), a chapter marker where each chapter's audio starts,
the book's title and author, and its cover when it has one.

MP4 keeps its index after the audio, so the file is written to a seekable file, never streamed;
the audio goes in as it comes (a book is hours: never whole in memory). PyAV (FFmpeg's `ipod`
muxer) writes the audio and the chapters; the cover is an `covr` atom that mutagen adds after.
Blocking: run off the event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import soxr

from engines.base import Audio

BIT_RATE = 64_000
"""AAC bit rate for speech in mono (audiobook stores sell 32-64 kbps)."""
TAG_CHARS = 500
"""Longest title, author or chapter name written."""
BRAND = "M4B "
"""The MP4 brand players know an audiobook by."""


@dataclass(frozen=True)
class BookChapter:
    title: str
    audio: Iterable[Audio]
    """The chapter's audio in pieces, at the book's rate."""


@dataclass(frozen=True)
class ChapterMark:
    title: str
    start: float
    """Seconds from the book's start to the chapter's first sample."""
    end: float


def write_m4b(path: Path, chapters: Iterable[BookChapter], rate: int, *, title: str | None = None,
              author: str | None = None, cover: bytes | None = None,
              pause_seconds: float = 0.0) -> list[ChapterMark]:
    """Write the book to `path`: each chapter's audio in order, `pause_seconds` of silence
    before each chapter after the first (counted in the chapter before it, so a marker falls on
    its chapter's first sample). Returns the markers written."""
    marks: list[ChapterMark] = []
    at = 0  # samples written
    pause = np.zeros(round(pause_seconds * rate), dtype=np.float32)
    with av.open(str(path), "w", format="ipod", options={"brand": BRAND}) as container:
        for key, value in (("title", title), ("album", title), ("artist", author),
                           ("album_artist", author), ("genre", "Audiobook")):
            if value and (value := _tag(value)):
                container.metadata[key] = value
        stream = container.add_stream("aac", rate=rate)
        stream.layout = "mono"
        stream.bit_rate = BIT_RATE

        def put(samples: Audio) -> None:
            nonlocal at
            if not len(samples):
                return
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1), format="flt",
                layout="mono")
            frame.sample_rate = rate
            frame.pts = at
            frame.time_base = Fraction(1, rate)
            for packet in stream.encode(frame):
                container.mux(packet)
            at += len(samples)

        for n, chapter in enumerate(chapters):
            if n:
                put(pause)
            start = at
            for piece in chapter.audio:
                put(piece)
            marks.append(ChapterMark(_tag(chapter.title) or f"Chapter {n + 1}", start / rate,
                                     at / rate))
        for packet in stream.encode(None):
            container.mux(packet)
        ends = [round(m.start * 1000) for m in marks[1:]] + [round(at * 1000 / rate)]
        container.set_chapters([
            {"id": n + 1, "start": round(m.start * 1000), "end": end,
             "time_base": Fraction(1, 1000), "metadata": {"title": m.title}}
            for n, (m, end) in enumerate(zip(marks, ends, strict=True))])
    if cover:
        _add_cover(path, cover)
    return marks


def _tag(text: str) -> str:
    """A tag's text: control characters (a NUL would end it) as spaces, at most `TAG_CHARS`."""
    return " ".join("".join(" " if ord(c) < 32 or ord(c) == 127 else c
                            for c in text[:TAG_CHARS]).split())


def resampled(pieces: Iterable[Audio], rate: int, to: int) -> Iterator[Audio]:
    """`pieces` at `rate` as pieces at `to` (soxr's stream: a chapter is never whole)."""
    if rate == to:
        yield from pieces
        return
    stream = soxr.ResampleStream(rate, to, 1, dtype="float32", quality="HQ")
    for piece in pieces:
        yield np.asarray(stream.resample_chunk(np.asarray(piece, dtype=np.float32)),
                         dtype=np.float32)
    yield np.asarray(stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True),
                     dtype=np.float32)


def _add_cover(path: Path, cover: bytes) -> None:
    from mutagen.mp4 import MP4, MP4Cover

    kind = MP4Cover.FORMAT_PNG if cover.startswith(b"\x89PNG") else MP4Cover.FORMAT_JPEG
    book = MP4(str(path))  # type: ignore[no-untyped-call]
    if book.tags is None:
        book.add_tags()  # type: ignore[no-untyped-call]
    assert book.tags is not None
    book.tags["covr"] = [MP4Cover(cover, imageformat=kind)]
    book.save()
