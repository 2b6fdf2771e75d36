"""The job store: SQLite (the standard library's) and segment files under the data dir.

`<data_dir>/jobs.sqlite3` holds jobs, their items and their planned segments; a finished segment's
audio is `<data_dir>/jobs/<id>/<seq>.pcm` (16-bit mono at its model's rate, the pause before it
included). A segment counts as done once its file is complete and renamed into place and its row
says so, in that order, each durable before the next: a kill -9 at any moment leaves at worst a
segment to render again, never one half stored. WAL journal, `synchronous=NORMAL`: a commit
survives the process dying (not a power cut in the last instant).

The bound `max_bytes` counts every job's text and its segment and ZIP files; a new job or a
segment that would pass it, or a disk that is really full, is refused or fails its job
(`DiskFull`), never the server. Every byte counted is given back: a segment stored while its job
is being deleted finds no row to mark, and takes its file and its bytes back itself.

An item and its segments are read by their own index (`item`, `segments(job, item)`), never by
a walk over the whole job: the runner and the chapter routes read one item at a time, and a job
may have tens of thousands. A database made before `segments_by_item` gets it when opened.

Progress is counted as segments are stored, in the same transaction: the job's segments, those
done and its seconds of audio (on `jobs`), and each item's (`summaries`: an item's title, length,
options, error and rate beside its counts, without its text). A job's card reads those, never
the items' texts nor every segment. A database written by the previous version (no counts) is
counted once when it is opened.

Blocking, every call: the job runner and the routes call the store off the event loop.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from app.jobs.model import (
    FINISHED,
    DiskFull,
    Item,
    ItemOptions,
    ItemSummary,
    Job,
    JobKind,
    JobNotFound,
    JobStatus,
    Segment,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
    request TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL, finished REAL,
    error TEXT, bytes INTEGER NOT NULL DEFAULT 0,
    seg_total INTEGER, seg_done INTEGER, audio_seconds REAL
);
CREATE TABLE IF NOT EXISTS items (
    job TEXT NOT NULL, idx INTEGER NOT NULL, title TEXT NOT NULL, text TEXT NOT NULL,
    options TEXT NOT NULL, asked TEXT NOT NULL, error TEXT, sample_rate INTEGER, reading TEXT,
    PRIMARY KEY (job, idx)
);
CREATE TABLE IF NOT EXISTS segments (
    job TEXT NOT NULL, seq INTEGER NOT NULL, item INTEGER NOT NULL, part INTEGER NOT NULL,
    text TEXT NOT NULL, offset INTEGER NOT NULL, samples INTEGER, words TEXT, how TEXT,
    PRIMARY KEY (job, seq)
);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, created);
CREATE INDEX IF NOT EXISTS segments_by_item ON segments (job, item, seq);
CREATE TABLE IF NOT EXISTS summaries (
    job TEXT NOT NULL, idx INTEGER NOT NULL, title TEXT NOT NULL, chars INTEGER NOT NULL,
    options TEXT NOT NULL, error TEXT, sample_rate INTEGER, segments INTEGER NOT NULL,
    done INTEGER NOT NULL DEFAULT 0, samples INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, idx)
);
"""

COUNTS = {"seg_total": "INTEGER", "seg_done": "INTEGER", "audio_seconds": "REAL"}
ADDED = [*(("jobs", name, kind) for name, kind in COUNTS.items()),
         ("items", "reading", "TEXT"), ("segments", "how", "TEXT")]
"""Columns added since the first version: (table, column, type)."""
"""A job's progress, on its row: columns a database of the previous version gets when opened
(NULL on its rows until they are counted)."""

_COUNT_OLD = """
INSERT OR REPLACE INTO summaries (job, idx, title, chars, options, error, sample_rate, segments,
                                  done, samples)
SELECT i.job, i.idx, i.title, length(i.text), i.options, i.error, i.sample_rate,
       COALESCE(c.total, 0), COALESCE(c.done, 0), COALESCE(c.samples, 0)
FROM items i JOIN jobs j ON j.id = i.job
LEFT JOIN (SELECT job, item, COUNT(*) AS total, COUNT(samples) AS done,
                  SUM(samples) AS samples FROM segments GROUP BY job, item) c
       ON c.job = i.job AND c.item = i.idx
WHERE j.seg_total IS NULL;
UPDATE jobs SET
    seg_total = (SELECT COALESCE(SUM(segments), 0) FROM summaries WHERE job = jobs.id),
    seg_done = (SELECT COALESCE(SUM(done), 0) FROM summaries WHERE job = jobs.id)
WHERE seg_total IS NULL;
"""

_SECONDS = """
UPDATE jobs SET audio_seconds = (
    SELECT COALESCE(SUM(CAST(samples AS REAL) / sample_rate), 0) FROM summaries
    WHERE job = jobs.id AND sample_rate > 0)
WHERE id = ?
"""

_NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

WordRow = tuple[str, float, float, int, int]
"""A stored word: text, start and end in seconds from its segment's first sample, its span in
the item's text."""


def stored_size(items: list[Item], segments: list[Segment]) -> int:
    """Bytes a new job's text takes in a store: its items' text and reading, its segments'."""
    return (sum(len(i.text.encode()) + (len(json.dumps(i.reading)) if i.reading else 0)
                for i in items)
            + sum(len(s.text.encode()) + (len(json.dumps(s.how)) if s.how else 0)
                  for s in segments))


def no_room(used: int, size: int, max_bytes: int) -> DiskFull:
    return DiskFull(
        f"The job store has no room for {size} more bytes: {used} of {max_bytes} are used "
        "(VOXMUX_JOBS_MAX_BYTES); delete finished jobs or raise the bound", code="disk_full")


class Store(Protocol):
    """What the runner, the routes and the results read and write: `JobStore` here, or
    `app.jobs.redis_store.RedisJobStore` for processes sharing jobs."""

    max_bytes: int

    def create(self, job: Job, items: list[Item], segments: list[Segment]) -> None: ...
    def job(self, job_id: str) -> Job | None: ...
    def jobs(self, owner: str | None = None, status: tuple[str, ...] | None = None
             ) -> list[Job]: ...
    def recent(self, owner: str, limit: int, after: str | None = None) -> list[Job]: ...
    def items(self, job_id: str) -> list[Item]: ...
    def item(self, job_id: str, index: int) -> Item | None: ...
    def item_count(self, job_id: str) -> int: ...
    def segments(self, job_id: str, item: int | None = None) -> list[Segment]: ...
    def counts(self, job_id: str) -> tuple[int, int, float]: ...
    def summaries(self, job_id: str, start: int = 0, limit: int | None = None
                  ) -> list[ItemSummary]: ...
    def words(self, job_id: str, item: int) -> list[list[WordRow]]: ...
    def audio(self, job_id: str, seq: int) -> npt.NDArray[np.float32]: ...
    def file(self, job_id: str, name: str) -> Path: ...
    def set_status(self, job_id: str, status: JobStatus, error: dict[str, Any] | None = None
                   ) -> None: ...
    def set_item(self, job_id: str, index: int, *, sample_rate: int | None = None,
                 error: dict[str, Any] | None = None) -> None: ...
    def finish_segment(self, job_id: str, seq: int, pcm16: bytes, words: list[WordRow]
                       ) -> None: ...
    def add_file(self, job_id: str, name: str, size: int) -> None: ...
    def reserve(self, size: int) -> None: ...
    def unreserve(self, size: int) -> None: ...
    def delete(self, job_id: str) -> None: ...
    def expired(self, older_than: float) -> list[str]: ...
    def interrupted(self) -> list[str]: ...
    def prune(self) -> None: ...
    def close(self) -> None: ...


class JobStore:
    def __init__(self, data_dir: Path, max_bytes: int) -> None:
        self.root = data_dir / "jobs"
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._lock = threading.RLock()
        self._db = sqlite3.connect(data_dir / "jobs.sqlite3", check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._count_old()
        self.used = int(self._one("SELECT COALESCE(SUM(bytes), 0) FROM jobs")[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _count_old(self) -> None:
        """Bring a database an earlier version wrote up to date: the columns it lacks added,
        and its jobs (no counts kept) counted once, from their items and segments."""
        with self._write() as db:
            for table, name, kind in ADDED:
                columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if name not in columns:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
            old = [r[0] for r in db.execute("SELECT id FROM jobs WHERE seg_total IS NULL")]
            if old:
                for statement in _COUNT_OLD.split(";"):
                    if statement.strip():
                        db.execute(statement)
                for job_id in old:
                    db.execute(_SECONDS, (job_id,))

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _one(self, sql: str, *args: Any) -> tuple[Any, ...]:
        with self._lock:
            row = self._db.execute(sql, args).fetchone()
        return tuple(row) if row else ()

    def _all(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        with self._lock:
            return [tuple(r) for r in self._db.execute(sql, args).fetchall()]

    # -- making ------------------------------------------------------------------------------

    def create(self, job: Job, items: list[Item], segments: list[Segment]) -> None:
        """Store a new job; its text counts against the bound too (`DiskFull` past it), so
        jobs queued by the thousand cannot grow the database without limit."""
        size = stored_size(items, segments)
        self._reserve(size)
        try:
            self._insert(job, items, segments, size)
        except BaseException:
            self._release(size)
            raise
        (self.root / job.id).mkdir(exist_ok=True)

    def _insert(self, job: Job, items: list[Item], segments: list[Segment], size: int) -> None:
        per_item = {i.index: 0 for i in items}
        for segment in segments:
            if segment.item in per_item:  # (a segment of no item is not counted)
                per_item[segment.item] += 1
        with self._write() as db:
            db.execute("INSERT INTO jobs (id, owner, kind, status, request, created, updated, "
                       "bytes, seg_total, seg_done, audio_seconds) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0.0)",
                       (job.id, job.owner, job.kind, job.status, json.dumps(job.request),
                        job.created, job.updated, size, sum(per_item.values())))
            db.executemany(
                "INSERT INTO items (job, idx, title, text, options, asked, error, sample_rate, "
                "reading) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(job.id, i.index, i.title, i.text, json.dumps(i.options.__dict__),
                  json.dumps(i.asked), json.dumps(i.error) if i.error else None, i.sample_rate,
                  json.dumps(i.reading) if i.reading else None)
                 for i in items])
            db.executemany(
                "INSERT INTO summaries (job, idx, title, chars, options, error, sample_rate, "
                "segments) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(job.id, i.index, i.title, len(i.text), json.dumps(i.options.__dict__),
                  json.dumps(i.error) if i.error else None, i.sample_rate, per_item[i.index])
                 for i in items])
            db.executemany(
                "INSERT INTO segments (job, seq, item, part, text, offset, how) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(job.id, s.seq, s.item, s.part, s.text, s.offset,
                  json.dumps(s.how) if s.how else None) for s in segments])

    # -- reading -----------------------------------------------------------------------------

    def job(self, job_id: str) -> Job | None:
        row = self._one("SELECT id, owner, kind, status, created, updated, request, finished, "
                        "error, bytes FROM jobs WHERE id = ?", job_id)
        return _job(row) if row else None

    def jobs(self, owner: str | None = None, status: tuple[str, ...] | None = None
             ) -> list[Job]:
        sql = ("SELECT id, owner, kind, status, created, updated, request, finished, error, "
               "bytes FROM jobs")
        where, args = [], []
        if owner is not None:
            where.append("owner = ?")
            args.append(owner)
        if status:
            where.append(f"status IN ({', '.join('?' * len(status))})")
            args += status
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [_job(r) for r in self._all(sql + " ORDER BY created", *args)]

    def recent(self, owner: str, limit: int, after: str | None = None) -> list[Job]:
        """The owner's jobs, newest first: at most `limit`, those made before job `after`
        (its id; none when it is not the owner's)."""
        sql = ("SELECT id, owner, kind, status, created, updated, request, finished, error, "
               "bytes FROM jobs WHERE owner = ?")
        args: list[Any] = [owner]
        if after is not None:
            sql += (" AND EXISTS (SELECT 1 FROM jobs a WHERE a.id = ? AND a.owner = jobs.owner "
                    "AND (jobs.created < a.created OR (jobs.created = a.created "
                    "AND jobs.id < a.id)))")
            args.append(after)
        rows = self._all(sql + " ORDER BY created DESC, id DESC LIMIT ?", *args, limit)
        return [_job(r) for r in rows]

    def items(self, job_id: str) -> list[Item]:
        rows = self._all(f"SELECT {_ITEM} FROM items WHERE job = ? ORDER BY idx", job_id)
        return [_item(r) for r in rows]

    def item(self, job_id: str, index: int) -> Item | None:
        """One item (its text included), read by its key."""
        row = self._one(f"SELECT {_ITEM} FROM items WHERE job = ? AND idx = ?", job_id, index)
        return _item(row) if row else None

    def item_count(self, job_id: str) -> int:
        return int(self._one("SELECT COUNT(*) FROM items WHERE job = ?", job_id)[0])

    def segments(self, job_id: str, item: int | None = None) -> list[Segment]:
        sql = "SELECT seq, item, part, text, offset, samples, how FROM segments WHERE job = ?"
        args: list[Any] = [job_id]
        if item is not None:
            sql += " AND item = ?"
            args.append(item)
        return [Segment(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]) if r[6] else None)
                for r in self._all(sql + " ORDER BY seq", *args)]

    def counts(self, job_id: str) -> tuple[int, int, float]:
        """(segments done, segments in all, seconds of audio stored), as counted."""
        row = self._one("SELECT seg_done, seg_total, audio_seconds FROM jobs WHERE id = ?",
                        job_id)
        return (int(row[0]), int(row[1]), float(row[2])) if row else (0, 0, 0.0)

    def summaries(self, job_id: str, start: int = 0, limit: int | None = None
                  ) -> list[ItemSummary]:
        """Each item without its text, with its counts: from item `start`, at most `limit`
        (a card of many thousands is read a page at a time)."""
        rows = self._all("SELECT idx, title, chars, options, error, sample_rate, segments, "
                         "done, samples FROM summaries WHERE job = ? AND idx >= ? ORDER BY idx "
                         "LIMIT ?", job_id, start, -1 if limit is None else limit)
        return [ItemSummary(r[0], r[1], r[2], ItemOptions(**json.loads(r[3])),
                            json.loads(r[4]) if r[4] else None, r[5], r[6], r[7], r[8])
                for r in rows]

    def words(self, job_id: str, item: int) -> list[list[WordRow]]:
        rows = self._all("SELECT words FROM segments WHERE job = ? AND item = ? ORDER BY seq",
                         job_id, item)
        return [[tuple(w) for w in json.loads(r[0])] if r[0] else [] for r in rows]

    def audio(self, job_id: str, seq: int) -> npt.NDArray[np.float32]:
        """A finished segment's samples, exactly as encoders turn them back into 16 bits."""
        pcm = np.fromfile(self._path(job_id, seq), dtype="<i2")
        return pcm.astype(np.float32) / np.float32(32767.0)

    def _path(self, job_id: str, seq: int) -> Path:
        return self.root / job_id / f"{seq:07d}.pcm"

    def file(self, job_id: str, name: str) -> Path:
        return self.root / job_id / name

    # -- writing -----------------------------------------------------------------------------

    def set_status(self, job_id: str, status: JobStatus, error: dict[str, Any] | None = None
                   ) -> None:
        """A job's new status; an ended one (done, failed, cancelled) keeps its own."""
        now = time.time()
        finished = now if status in FINISHED else None
        with self._write() as db:
            db.execute("UPDATE jobs SET status = ?, updated = ?, finished = ?, error = ? "
                       "WHERE id = ? AND status NOT IN ('done', 'failed', 'cancelled')",
                       (status, now, finished, json.dumps(error) if error else None, job_id))

    def set_item(self, job_id: str, index: int, *, sample_rate: int | None = None,
                 error: dict[str, Any] | None = None) -> None:
        with self._write() as db:
            for table in ("items", "summaries"):
                if sample_rate is not None:
                    db.execute(f"UPDATE {table} SET sample_rate = ? WHERE job = ? AND idx = ?",
                               (sample_rate, job_id, index))
                if error is not None:
                    db.execute(f"UPDATE {table} SET error = ? WHERE job = ? AND idx = ?",
                               (json.dumps(error), job_id, index))
            if sample_rate is not None:  # its audio, counted anew at its new rate
                db.execute(_SECONDS, (job_id,))

    def finish_segment(self, job_id: str, seq: int, pcm16: bytes, words: list[WordRow]
                       ) -> None:
        """Store one rendered segment (again: it replaces the one stored, and counts the
        difference). `DiskFull` when the bound or the disk has no room, `JobNotFound` when the
        job is gone (deleted meanwhile): either way nothing of the segment is left behind, its
        bytes included."""
        size = len(pcm16)
        self._reserve(size)
        path = self._path(job_id, seq)
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "wb") as handle:  # (never makes the folder of a deleted job)
                handle.write(pcm16)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            self._release(size)
            tmp.unlink(missing_ok=True)
            if exc.errno in _NO_ROOM:
                raise DiskFull(f"The disk has no room for the job's audio ({exc.strerror})",
                               code="disk_full") from None
            if isinstance(exc, FileNotFoundError):
                raise JobNotFound(f"Job {job_id} is gone (deleted?)") from None
            raise
        try:
            replaced = self._mark_done(job_id, seq, size // 2, words)
        except BaseException:
            self._release(size)
            path.unlink(missing_ok=True)
            self._drop_folder(job_id)
            raise
        self._release(2 * replaced)  # the file it replaced

    def _mark_done(self, job_id: str, seq: int, samples: int, words: list[WordRow]) -> int:
        """Mark the segment stored and count it, in one transaction; the samples it had before
        (0 if none). `JobNotFound` when the job has been deleted."""
        with self._write() as db:
            row = db.execute("SELECT s.item, s.samples, c.sample_rate, c.idx IS NOT NULL "
                             "FROM segments s LEFT JOIN summaries c "
                             "ON c.job = s.job AND c.idx = s.item WHERE s.job = ? AND s.seq = ?",
                             (job_id, seq)).fetchone()
            if row is None:
                raise JobNotFound(f"Job {job_id} has no segment {seq} (deleted?)")
            item, before, rate, counted = row
            added = samples - (before or 0)
            db.execute("UPDATE segments SET samples = ?, words = ? WHERE job = ? AND seq = ?",
                       (samples, json.dumps(words) if words else None, job_id, seq))
            if counted:  # (a segment of no item is not counted, as it never was)
                new = int(before is None)
                db.execute("UPDATE summaries SET done = done + ?, samples = samples + ? "
                           "WHERE job = ? AND idx = ?", (new, added, job_id, item))
                db.execute("UPDATE jobs SET seg_done = seg_done + ?, "
                           "audio_seconds = audio_seconds + ? WHERE id = ?",
                           (new, added / rate if rate else 0.0, job_id))
            db.execute("UPDATE jobs SET bytes = bytes + ?, updated = ? WHERE id = ?",
                       (2 * added, time.time(), job_id))
        return int(before or 0)

    def _drop_folder(self, job_id: str) -> None:
        """The folder of a job deleted while a file was being written into it, once empty."""
        if self.job(job_id) is None:
            with contextlib.suppress(OSError):
                (self.root / job_id).rmdir()

    def add_file(self, job_id: str, name: str, size: int) -> None:
        """Count a file written into the job's folder (its ZIP; `reserve`d first) against the
        bound; `JobNotFound` (the file removed, its bytes given back) once the job is gone."""
        with self._write() as db:
            found = db.execute("UPDATE jobs SET bytes = bytes + ? WHERE id = ?",
                               (size, job_id)).rowcount
        if not found:
            self._release(size)
            self.file(job_id, name).unlink(missing_ok=True)
            self._drop_folder(job_id)
            raise JobNotFound(f"Job {job_id} is gone (deleted?)")

    def reserve(self, size: int) -> None:
        """Count `size` bytes of a file about to be written into a job's folder (`add_file`
        then counts them as the job's); `DiskFull` when the bound has no room."""
        self._reserve(size)

    def unreserve(self, size: int) -> None:
        """Give back a reservation whose file never reached its job (`reserve`)."""
        self._release(size)

    def _reserve(self, size: int) -> None:
        with self._lock:
            if self.used + size > self.max_bytes:
                raise no_room(self.used, size, self.max_bytes)
            self.used += size

    def _release(self, size: int) -> None:
        with self._lock:
            self.used -= size

    def delete(self, job_id: str) -> None:
        """Remove the job and its files, and give back its bytes as counted in the same
        transaction (a segment stored just before is in them; one stored after gives its own
        back: `finish_segment`)."""
        with self._write() as db:
            row = db.execute("SELECT bytes FROM jobs WHERE id = ?", (job_id,)).fetchone()
            for table, key in (("segments", "job"), ("summaries", "job"), ("items", "job"),
                               ("jobs", "id")):
                db.execute(f"DELETE FROM {table} WHERE {key} = ?", (job_id,))
        if row is not None:
            self._release(int(row[0]))
        shutil.rmtree(self.root / job_id, ignore_errors=True)

    def expired(self, older_than: float) -> list[str]:
        """Finished jobs that ended before `older_than` (a time.time())."""
        rows = self._all("SELECT id FROM jobs WHERE finished IS NOT NULL AND finished < ?",
                         older_than)
        return [r[0] for r in rows]

    def interrupted(self) -> list[str]:
        """Jobs that were running or waiting when the last process stopped, oldest first."""
        rows = self._all("SELECT id FROM jobs WHERE status IN ('queued', 'running') "
                         "ORDER BY created")
        return [r[0] for r in rows]

    def prune(self) -> None:
        """Nothing to do: every file here belongs to a job of this store."""


_ITEM = "idx, title, text, options, asked, error, sample_rate, reading"


def _item(row: tuple[Any, ...]) -> Item:
    return Item(row[0], row[1], row[2], ItemOptions(**json.loads(row[3])), json.loads(row[4]),
                json.loads(row[5]) if row[5] else None, row[6],
                json.loads(row[7]) if row[7] else None)


def _job(row: tuple[Any, ...]) -> Job:
    kind: JobKind = row[2]
    status: JobStatus = row[3]
    return Job(id=row[0], owner=row[1], kind=kind, status=status, created=row[4],
               updated=row[5], request=json.loads(row[6]), finished=row[7],
               error=json.loads(row[8]) if row[8] else None, bytes=row[9])
