"""A job's results from its stored segments: each item's audio (in the asked format), its SRT and
WebVTT captions from the stored word timings, the whole job as one stream, and the ZIP of all of
them with a `manifest.json`, each chapter's audio written into it as it is encoded (a chapter of
a book can be hours: never whole in memory). Blocking: run off the event loop."""

from __future__ import annotations

import json
import time
import uuid
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from app.audio.audiobook import BookChapter, resampled, write_m4b
from app.audio.encoders import PCM_RATE, StreamEncoder
from app.jobs.model import Item, Job, JobNotFound
from app.jobs.store import Store
from app.protocols.timestamps import CaptionFormat, captions
from app.text.prepared import blank_markup
from engines.base import Audio, WordTiming

ZIP_NAME = "result.zip"
BOOK_NAME = "book.m4b"
COVER_NAME = "cover"
"""An EPUB's cover image, kept with its job for the audiobook."""


def encoder(fmt: str, rate: int) -> StreamEncoder:
    """`pcm` at OpenAI's 24 kHz, as on the speech route; other formats as the encoders choose."""
    return StreamEncoder(fmt, rate, PCM_RATE if fmt == "pcm" and rate != PCM_RATE else None)


def encoded(chunks: Iterable[Audio], fmt: str, rate: int) -> Iterator[bytes]:
    stream = encoder(fmt, rate)
    for chunk in chunks:
        if data := stream.encode(chunk):
            yield data
    yield stream.finish()


def encode_clip(samples: Audio, fmt: str, rate: int) -> bytes:
    return b"".join(encoded([samples], fmt, rate))


def item_chunks(store: Store, job_id: str, item: Item) -> Iterator[Audio]:
    for segment in store.segments(job_id, item.index):
        yield store.audio(job_id, segment.seq)


def item_ready(store: Store, job_id: str, item: Item) -> bool:
    segments = store.segments(job_id, item.index)
    return bool(segments) and all(s.samples is not None for s in segments)


def item_seconds(store: Store, job_id: str, item: Item) -> float | None:
    if not item.sample_rate:
        return None
    samples = [s.samples for s in store.segments(job_id, item.index)]
    if not samples or None in samples:
        return None
    return sum(s or 0 for s in samples) / item.sample_rate


def spoken(items: list[Item]) -> list[Item]:
    return [i for i in items if i.error is None]


def whole_rate(items: list[Item]) -> int:
    """The rate of a job's whole audio: its first spoken chapter's (the others are resampled)."""
    return next((i.sample_rate for i in spoken(items) if i.sample_rate), PCM_RATE)


def whole_chunks(store: Store, job_id: str, items: list[Item], pause_ms: int
                 ) -> Iterator[Audio]:
    """Every item's audio in order at `whole_rate(items)` (a chapter a model of another rate
    spoke is resampled), `pause_ms` of silence between two."""
    rate = whole_rate(items)
    for n, item in enumerate(spoken(items)):
        if n:
            yield np.zeros(round(rate * pause_ms / 1000), dtype=np.float32)
        yield from resampled(item_chunks(store, job_id, item), item.sample_rate or rate, rate)


def item_captions(store: Store, job_id: str, item: Item, fmt: CaptionFormat) -> str | None:
    """SRT or WebVTT for one item, from its segments' stored words; None without words."""
    rate = item.sample_rate or 1
    words: list[WordTiming] = []
    at = 0.0
    stored = store.words(job_id, item.index)
    for segment, rows in zip(store.segments(job_id, item.index), stored, strict=True):
        words += (WordTiming(w, start + at, end + at, cs, ce) for w, start, end, cs, ce in rows)
        at += (segment.samples or 0) / rate
    if not words:
        return None
    ssml = item.reading is not None and item.reading.get("ssml")
    return captions(blank_markup(item.text) if ssml else item.text, words, fmt)


def manifest_entry(index: int, file: str | None, asked: dict[str, Any], fmt: str,
                   duration: float | None, error: dict[str, Any] | None) -> dict[str, Any]:
    """One item of `manifest.json`: what the item asked (model and voice as sent), where its
    audio is, how long it lasts, or why there is none (OpenAI's error object)."""
    return {"index": index, "file": file, "model": asked.get("model"),
            "voice": asked.get("voice"), "format": fmt,
            "duration_s": None if duration is None else round(duration, 3), "error": error}


Member = tuple[str, bytes | Iterable[bytes]]
"""A file of a ZIP: its name, and its bytes or its bytes as they are made."""


def write_zip(target: Any, members: Iterable[Member], manifest: dict[str, Any]) -> None:
    """Audio stored as it is (already compressed or raw), text deflated; a member given as
    pieces is written piece by piece as they come (in ZIP64 from its start: its size is not
    known until its end)."""
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members:
            kind = (zipfile.ZIP_DEFLATED if name.endswith((".srt", ".vtt", ".json"))
                    else zipfile.ZIP_STORED)
            if isinstance(data, bytes):
                archive.writestr(name, data, kind)
                continue
            info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
            info.compress_type = kind
            info.external_attr = 0o600 << 16  # (as `writestr` marks a file)
            with archive.open(info, "w", force_zip64=True) as handle:
                for piece in data:
                    handle.write(piece)
        archive.writestr("manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False),
                         zipfile.ZIP_DEFLATED)


def job_zip(store: Store, job: Job) -> Path:
    """The finished job's ZIP (made once, kept in its folder, counted against the bound).
    One caller per job at a time (`JobRunner.result_zip`): two would race on one temporary
    file. `JobNotFound` when the job is deleted meanwhile."""
    path = store.file(job.id, ZIP_NAME)
    if path.exists():
        return path
    try:
        return _make_zip(store, job, path)
    except FileNotFoundError:  # its folder went with it
        raise JobNotFound(f"Job {job.id} is gone (deleted?)", param="id") from None


def _make_zip(store: Store, job: Job, path: Path) -> Path:
    items = store.items(job.id)
    entries: list[dict[str, Any]] = []

    def members() -> Iterator[Member]:
        for item in items:
            fmt = item.options.response_format
            name = f"{item.index + 1:03d}"
            if item.error is not None or not item_ready(store, job.id, item):
                entries.append(manifest_entry(item.index, None, item.asked, fmt, None,
                                              item.error))
                continue
            rate = item.sample_rate or 1
            yield f"{name}.{fmt}", encoded(item_chunks(store, job.id, item), fmt, rate)
            entry = manifest_entry(item.index, f"{name}.{fmt}", item.asked, fmt,
                                   item_seconds(store, job.id, item), None)
            if job.kind == "book":
                entry["title"] = item.title
                entry["captions"] = []
                captions_of: tuple[CaptionFormat, ...] = ("srt", "vtt")
                for caption in captions_of:
                    text = item_captions(store, job.id, item, caption)
                    if text is not None:
                        entry["captions"].append(f"{name}.{caption}")
                        yield f"{name}.{caption}", text.encode()
            entries.append(entry)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            write_zip(handle, members(), {"id": job.id, "items": entries})

    return _keep(store, job, path, write)


def _keep(store: Store, job: Job, path: Path, write: Callable[[Path], object]) -> Path:
    """A result file made beside `path` by `write`, then counted against the store's bound and
    put in place; nothing is left behind when either fails."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.tmp")  # two builders: two files
    try:
        write(tmp)
        size = tmp.stat().st_size
        store.reserve(size)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        tmp.replace(path)  # (a purge meanwhile took the folder: FileNotFoundError)
    except BaseException:
        store.unreserve(size)
        tmp.unlink(missing_ok=True)
        raise
    store.add_file(job.id, path.name, size)
    return path


def job_book(store: Store, job: Job, pause_ms: int) -> Path:
    """The finished book job as one audiobook (`BOOK_NAME`, made once and kept like the ZIP;
    the same one caller at a time): its chapters that were spoken, each marked where its audio
    starts, `pause_ms` between two, with the job's title and, from an EPUB, author and cover."""
    path = store.file(job.id, BOOK_NAME)
    if path.exists():
        return path
    items = spoken(store.items(job.id))
    rate = whole_rate(items)
    cover = store.file(job.id, COVER_NAME)
    chapters = [BookChapter(i.title, resampled(item_chunks(store, job.id, i),
                                               i.sample_rate or rate, rate)) for i in items]

    def write(tmp: Path) -> None:
        write_m4b(tmp, chapters, rate, title=job.request.get("title"),
                  author=job.request.get("author"),
                  cover=cover.read_bytes() if cover.exists() else None,
                  pause_seconds=pause_ms / 1000)

    try:
        return _keep(store, job, path, write)
    except FileNotFoundError:
        raise JobNotFound(f"Job {job.id} is gone (deleted?)", param="id") from None
