"""A job's progress is counted as its segments are stored, in both stores alike: a job's card
(and each chapter's line on it) reads a few small values per item, never the book's text nor
every segment, however long the book; and jobs stored by the previous version, which kept no
counts, still read right (counted once)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from app.jobs.front import job_card
from app.jobs.model import Item, ItemOptions, Job, Segment
from app.jobs.redis_store import RedisJobStore
from app.jobs.runner import JobRunner
from app.jobs.store import JobStore
from tests.conftest import test_settings
from tests.redisserver import redis_server

_PREFIXES = itertools.count()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis-counts"), maxmemory="256mb",
                      policy="noeviction") as url:
        yield url


@pytest.fixture(params=["sqlite", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "sqlite":
        opened: Any = JobStore(tmp_path, 10**9)
    else:
        url = request.getfixturevalue("redis_url")
        opened = RedisJobStore(url, tmp_path, 10**9, prefix=f"counts{next(_PREFIXES)}:jobs:")
    yield opened
    opened.close()


def a_book(job_id: str, chapters: int, segments: int, chars: int) -> tuple[
        Job, list[Item], list[Segment]]:
    """`chapters` chapters of `chars` characters, each cut into `segments` segments; the last
    chapter could not be spoken (no segments, an error)."""
    job = Job(job_id, "anonymous", "book", "queued", 1.0, 1.0, {"model": "espeak"})
    items, cut = [], []
    size = chars // segments
    for n in range(chapters):
        text = ("Some words to read aloud. " * (chars // 26 + 1))[:chars]
        error = {"message": "No model", "type": "invalid_request_error"} if n == chapters - 1 \
            else None
        items.append(Item(n, f"Chapter {n + 1}", text, ItemOptions("espeak", "en-us"),
                          {"input": text}, error, None if error else 22050))
        if error is None:
            first = len(cut)
            cut += [Segment(first + k, n, k, text[k * size:(k + 1) * size], k * size)
                    for k in range(segments)]
    return job, items, cut


def slow_truth(store: Any, job_id: str) -> tuple[tuple[int, int, float], list[dict[str, Any]]]:
    """What the counts must say, from every item and every segment."""
    items = {i.index: i for i in store.items(job_id)}
    segments = [s for s in store.segments(job_id) if s.item in items]
    seconds = math.fsum(s.samples / items[s.item].sample_rate  # type: ignore[operator]
                        for s in segments if s.samples and items[s.item].sample_rate)
    counts = (sum(s.samples is not None for s in segments), len(segments), seconds)
    chapters = []
    for item in items.values():
        mine = [s for s in segments if s.item == item.index]
        chapters.append({"index": item.index, "title": item.title, "chars": len(item.text),
                         "options": item.options, "error": item.error,
                         "sample_rate": item.sample_rate, "segments": len(mine),
                         "done": sum(s.samples is not None for s in mine),
                         "samples": sum(s.samples or 0 for s in mine)})
    return counts, chapters


def assert_counted(store: Any, job_id: str) -> None:
    (done, total, seconds), chapters = slow_truth(store, job_id)
    counted = store.counts(job_id)
    assert counted[:2] == (done, total)
    assert counted[2] == pytest.approx(seconds, rel=1e-9, abs=1e-9)
    summaries = [{"index": s.index, "title": s.title, "chars": s.chars, "options": s.options,
                  "error": s.error, "sample_rate": s.sample_rate, "segments": s.segments,
                  "done": s.done, "samples": s.samples} for s in store.summaries(job_id)]
    assert summaries == chapters


def test_progress_is_counted_as_segments_are_stored(store: Any) -> None:
    store.create(*a_book("job_a", chapters=3, segments=4, chars=400))
    assert_counted(store, "job_a")
    for seq, samples in ((5, 1000), (0, 2205), (1, 300), (5, 700), (7, 22050)):
        store.finish_segment("job_a", seq, b"\1\0" * samples, [])  # seq 5 twice: replaced
        assert_counted(store, "job_a")
    store.set_item("job_a", 1, sample_rate=16000)  # a new rate: its seconds counted anew
    store.set_item("job_a", 0, error={"message": "later", "type": "server_error"})
    assert_counted(store, "job_a")
    assert store.counts("job_a")[:2] == (4, 8)
    assert store.counts("job_missing") == (0, 0, 0.0) and store.summaries("job_missing") == []
    store.delete("job_a")
    assert store.counts("job_a") == (0, 0, 0.0) and store.summaries("job_a") == []


def test_a_card_of_a_long_book_reads_no_text_and_not_every_segment(
        store: Any, tmp_path: Path, redis_url: str) -> None:
    """2,000,000 characters in 200 chapters of 19 segments (3,800): the card with every
    chapter reads each chapter's few counts, not its 10,000 characters nor its segments."""
    store.create(*a_book("job_long", chapters=201, segments=19, chars=10_000))
    for seq in range(0, 3800, 7):
        store.finish_segment("job_long", seq, b"\0\0" * 22050, [])
    runner = JobRunner(None, test_settings(tmp_path))  # type: ignore[arg-type]
    runner.store = store
    job = store.job("job_long")
    expected = slow_truth(store, "job_long")[0]
    if isinstance(store, JobStore):
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        body = asyncio.run(job_card(runner, job, chapters=True))
        store._db.set_trace_callback(None)
        reads = [s for s in statements if re.search(r"\b(FROM|JOIN)\s+(items|segments)\b", s)]
        assert reads == [], reads
    else:
        info = redis.Redis.from_url(redis_url)
        sent = int(info.info("stats")["total_net_output_bytes"])
        body = asyncio.run(job_card(runner, job, chapters=True))
        sent = int(info.info("stats")["total_net_output_bytes"]) - sent
        info.close()
        assert sent < 200_000, f"{sent:,} bytes read from Redis for one card"
    assert (body.progress.done, body.progress.total) == expected[:2] == (543, 3800)
    assert body.progress.audio_seconds == pytest.approx(543.0)
    assert body.chapters is not None and len(body.chapters) == 201
    first = body.chapters[0]
    assert first["chars"] == 10_000 and first["title"] == "Chapter 1" and not first["ready"]
    assert body.chapters[-1]["error"]["message"] == "No model"


OLD_SCHEMA = """
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
    request TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, finished REAL,
    error TEXT, bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE items (
    job TEXT NOT NULL, idx INTEGER NOT NULL, title TEXT NOT NULL, text TEXT NOT NULL,
    options TEXT NOT NULL, asked TEXT NOT NULL, error TEXT, sample_rate INTEGER,
    PRIMARY KEY (job, idx)
);
CREATE TABLE segments (
    job TEXT NOT NULL, seq INTEGER NOT NULL, item INTEGER NOT NULL, part INTEGER NOT NULL,
    text TEXT NOT NULL, offset INTEGER NOT NULL, samples INTEGER, words TEXT,
    PRIMARY KEY (job, seq)
);
CREATE INDEX jobs_by_owner ON jobs (owner, created);
"""


def store_as_before(kind: str, tmp_path: Path, url: str, prefix: str) -> int:
    """A job written as the previous version wrote it (no counts), two of its 8 segments
    stored (the second chapter's first), its audio files or keys beside; its bytes."""
    job, items, segments = a_book("job_old", chapters=3, segments=4, chars=400)
    done = {0: 2205, 4: 1000}
    size = sum(len(i.text) for i in items) + sum(len(s.text) for s in segments) \
        + 2 * sum(done.values())
    options = json.dumps({"model": "espeak", "voice": "en-us", "speed": 1.0, "language": None,
                          "instructions": None, "response_format": "mp3"})
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
            db.executescript(OLD_SCHEMA)
            db.execute("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?)",
                       (job.id, job.owner, job.kind, "running", "{}", 1.0, 1.0, size))
            db.executemany("INSERT INTO items VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                           [(job.id, i.index, i.title, i.text, options, "{}",
                             json.dumps(i.error) if i.error else None, i.sample_rate)
                            for i in items])
            db.executemany("INSERT INTO segments VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
                           [(job.id, s.seq, s.item, s.part, s.text, s.offset,
                             done.get(s.seq)) for s in segments])
        folder = tmp_path / "jobs" / job.id
        folder.mkdir(parents=True)
        for seq, samples in done.items():
            (folder / f"{seq:07d}.pcm").write_bytes(b"\0\0" * samples)
        return size
    client = redis.Redis.from_url(url)
    client.hset(f"{prefix}job:{job.id}", mapping={
        "owner": job.owner, "kind": job.kind, "status": "running", "request": "{}",
        "created": "1.0", "updated": "1.0", "finished": "", "error": "", "bytes": size})
    client.zadd(f"{prefix}index", {job.id: 1.0})
    client.hset(f"{prefix}items:{job.id}", mapping={str(i.index): json.dumps({
        "title": i.title, "text": i.text, "options": json.loads(options), "asked": {},
        "error": i.error, "sample_rate": i.sample_rate}) for i in items})
    client.hset(f"{prefix}seg:{job.id}", mapping={str(s.seq): json.dumps({
        "item": s.item, "part": s.part, "text": s.text, "offset": s.offset,
        "samples": done.get(s.seq)}) for s in segments})
    for seq, samples in done.items():
        client.set(f"{prefix}audio:{job.id}:{seq}", b"\0\0" * samples)
    client.incrby(f"{prefix}used", size)
    client.close()
    return size


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_job_stored_by_the_previous_version_is_counted_once(
        kind: str, tmp_path: Path, redis_url: str) -> None:
    prefix = f"old{next(_PREFIXES)}:jobs:"
    size = store_as_before(kind, tmp_path, redis_url, prefix)
    store: Any = (JobStore(tmp_path, 10**9) if kind == "sqlite"
                  else RedisJobStore(redis_url, tmp_path, 10**9, prefix=prefix))
    try:
        assert store.counts("job_old")[:2] == (2, 8)
        assert_counted(store, "job_old")
        store.finish_segment("job_old", 1, b"\0\0" * 500, [])
        store.finish_segment("job_old", 0, b"\0\0" * 100, [])
        assert store.counts("job_old")[:2] == (3, 8)
        assert_counted(store, "job_old")
        assert store.used == size + 1000 - 4410 + 200
        store.delete("job_old")
        assert store.used == 0
    finally:
        store.close()
