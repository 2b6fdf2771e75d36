"""The job store in Redis, for several ingress processes (Ray Serve replicas) sharing jobs.

`RedisJobStore` answers every call of `JobStore` (app/jobs/store.py) the same way, with jobs,
items, segments and finished audio in Redis instead of SQLite and files. Keys, all under
`prefix` (`voxmux:jobs:` unless told):

    index                  sorted set: job id, scored by its `created`
    job:<id>               hash: owner, kind, status, request (JSON), created, updated,
                           finished ("" until it ends), error (JSON or ""), bytes; and its
                           progress: seg_total, seg_done, audio_seconds
    items:<id>             hash: item index -> JSON (title, text, options, asked, error,
                           sample_rate)
    meta:<id>              hash: item index -> JSON (title, chars, options, error,
                           sample_rate, segments_at): the item without its text, and where
                           its segments are (`[[first seq, count], ...]`)
    tally:<id>             hash: "<index>:segments", "<index>:done", "<index>:samples": each
                           item's counts
    seg:<id>               hash: seq -> JSON (item, part, text, offset, samples); `samples` is
                           null until the segment's audio is stored
    words:<id>             hash: seq -> JSON word rows, for finished segments that have words
    audio:<id>:<seq>       string: the segment's audio, 16-bit little-endian mono
    lease:<id>             string: the worker running the job, expiring (PX) unless renewed
    used                   integer: bytes counted against `max_bytes` by every process

The bound is shared: a new job (its text) or a segment (its audio) is checked against `used` and
counted in the same atomic step (a WATCH/MULTI transaction for a job, a Lua script for a
segment), so processes storing at once never pass it together. A segment's script stores the
audio, then marks the segment done, in one step: no process ever sees a segment done without
its audio, and a refused segment leaves nothing. Storing a segment again replaces it and counts
only the difference. Deleting a job removes all its keys and gives its bytes back at once.

An item's segments are read by their seqs (`segments_at` in its `meta:`, kept when the job is
stored), one `HMGET` of that item's alone: the runner and the chapter routes read one item at a
time, and reading the whole job's `seg:` for each (a job of 30,000 items: 17 rendered in 34 s)
costs the square of its length. A job stored before they were kept is read whole once to keep
them.

Progress is counted by the same script as each segment is stored (the job's counts on its hash,
each item's in `tally:`), so a job's card reads its hash and, for its chapters, `meta:` and
`tally:`: a few small values per item, never the items' texts nor every segment. A job stored by
the previous version, which kept no counts, is counted once when first read (in a transaction
that starts over if a segment is stored meanwhile).

Derived files (a job's ZIP) are not shared: each process builds its own from the segments under
`<data_dir>/jobs-cache/<id>/` (`file`), outside the bound (`reserve` only checks that the bound
has room, `add_file` counts nothing).

Leases: exactly one worker runs a job at a time. `claim` takes a job's lease (or refreshes it for
the worker already holding it), `renew` extends it, `release` gives it back, each only for its
holder; a process that dies stops renewing, its leases expire, and `claimable` lists its jobs for
another to take over.

Redis must keep this data: run it with `maxmemory-policy noeviction` (an evicting policy would
drop jobs; a warning is logged at start when one is set). Redis refusing a write for lack of
memory is `DiskFull`; Redis out of reach is `StoreUnavailable`. On a Redis Cluster, give a
prefix with a hash tag (`{voxmux}:jobs:`): the scripts and transactions touch several keys.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt
import redis
from redis.backoff import ExponentialBackoff
from redis.client import Pipeline
from redis.exceptions import OutOfMemoryError, RedisError, ResponseError
from redis.retry import Retry
from redis.typing import EncodableT, FieldT

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
    StoreUnavailable,
)
from app.jobs.store import WordRow, no_room, stored_size

log = logging.getLogger(__name__)

PREFIX = "voxmux:jobs:"
COUNTS = ("seg_done", "seg_total", "audio_seconds")
"""A job's progress, on its hash."""

_FINISH_SEGMENT = """
-- KEYS: used, job, seg, words, audio, meta, tally; ARGV: seq, segment JSON, words JSON or '',
-- audio, max_bytes, now, samples. Returns {1, used} stored, {0, 0} no such job or segment,
-- {-1, used} full.
if redis.call('EXISTS', KEYS[2]) == 0 or redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
  return {0, 0}
end
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local delta = string.len(ARGV[4]) - redis.call('STRLEN', KEYS[5])
if delta > 0 and used + delta > tonumber(ARGV[5]) then return {-1, used} end
local before = cjson.decode(redis.call('HGET', KEYS[3], ARGV[1]))
redis.call('SET', KEYS[5], ARGV[4])
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[4], ARGV[1])
else
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], 'bytes', delta)
redis.call('HSET', KEYS[2], 'updated', ARGV[6])
-- Its progress, on a job that is counted (one of the previous version is counted when read)
-- and an item that exists (a segment of no item is not counted).
local item = tostring(before['item'])
local meta = redis.call('HGET', KEYS[6], item)
if meta and redis.call('HEXISTS', KEYS[2], 'seg_total') == 1 then
  local added = tonumber(ARGV[7])
  if type(before['samples']) == 'number' then
    added = added - before['samples']
  else
    redis.call('HINCRBY', KEYS[2], 'seg_done', 1)
    redis.call('HINCRBY', KEYS[7], item .. ':done', 1)
  end
  redis.call('HINCRBY', KEYS[7], item .. ':samples', added)
  local rate = cjson.decode(meta)['sample_rate']
  if type(rate) == 'number' and rate > 0 then
    redis.call('HINCRBYFLOAT', KEYS[2], 'audio_seconds', string.format('%.17g', added / rate))
  end
end
return {1, redis.call('INCRBY', KEYS[1], delta)}
"""

_UPDATE_JOB = """
-- KEYS: job; ARGV: field, value, ... Set only on a job that exists and has not ended (done,
-- failed and cancelled are final: a cancel from another process is never overwritten).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'done' or status == 'failed' or status == 'cancelled' then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

_DELETE = """
-- KEYS: job, items, seg, words, lease, meta, tally, index, used; ARGV: audio key prefix, job id.
local bytes = tonumber(redis.call('HGET', KEYS[1], 'bytes') or '0')
for _, seq in ipairs(redis.call('HKEYS', KEYS[3])) do
  redis.call('DEL', ARGV[1] .. seq)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('ZREM', KEYS[8], ARGV[2])
if bytes ~= 0 and redis.call('DECRBY', KEYS[9], bytes) <= 0 then
  redis.call('DEL', KEYS[9])
end
return bytes
"""

_CLAIM = """
-- KEYS: lease, job; ARGV: worker, ms. Free, or already this worker's: (re)taken.
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisJobStore:
    """`JobStore` in Redis at `url`, shared by every process using the same `prefix`."""

    def __init__(self, url: str, data_dir: Path, max_bytes: int, prefix: str = PREFIX, *,
                 timeout: float = 5.0) -> None:
        self.max_bytes = max_bytes
        self.prefix = prefix
        self.cache = data_dir / "jobs-cache"
        self.cache.mkdir(parents=True, exist_ok=True)
        self._where = _public_url(url)
        self._redis = redis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2))
        self._finish = self._redis.register_script(_FINISH_SEGMENT)
        self._update_job = self._redis.register_script(_UPDATE_JOB)
        self._delete = self._redis.register_script(_DELETE)
        self._claim = self._redis.register_script(_CLAIM)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._used = prefix + "used"
        self._index = prefix + "index"
        with self._reach():
            self._redis.ping()
        self._check_policy()

    def close(self) -> None:
        self._redis.close()

    @property
    def used(self) -> int:
        """Bytes counted against the bound, by every process."""
        with self._reach():
            return int(self._redis.get(self._used) or 0)

    def _key(self, kind: str, job_id: str) -> str:
        return f"{self.prefix}{kind}:{job_id}"

    def _audio_key(self, job_id: str, seq: int) -> str:
        return f"{self.prefix}audio:{job_id}:{seq}"

    @contextmanager
    def _reach(self) -> Iterator[None]:
        """Redis's errors as the store's: no memory left is `DiskFull`, the rest (down,
        unreachable, refusing) `StoreUnavailable`."""
        try:
            yield
        except ResponseError as exc:  # OutOfMemoryError among them
            if not isinstance(exc, OutOfMemoryError) and "OOM" not in str(exc):
                raise StoreUnavailable(f"The job store's Redis at {self._where} refused a "
                                       f"command ({exc})", code="job_store_unavailable") from None
            raise DiskFull(f"The job store's Redis at {self._where} has no memory left "
                           "(its maxmemory); delete finished jobs or give Redis more memory",
                           code="disk_full") from None
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"The job store's Redis at {self._where} cannot be reached "
                                   f"({exc})", code="job_store_unavailable") from None

    def _check_policy(self) -> None:
        try:
            policy = self._redis.config_get("maxmemory-policy").get("maxmemory-policy")
        except RedisError:  # CONFIG is often disabled on managed Redis
            return
        if isinstance(policy, bytes):
            policy = policy.decode()
        if policy and str(policy).startswith("allkeys"):
            log.warning("jobs: the Redis at %s evicts keys (maxmemory-policy %s): jobs can be "
                        "lost; set maxmemory-policy noeviction", self._where, policy)

    def _full(self, used: int, size: int) -> DiskFull:
        return no_room(used, size, self.max_bytes)

    # -- making ------------------------------------------------------------------------------

    def create(self, job: Job, items: list[Item], segments: list[Segment]) -> None:
        """Store a new job; its text counts against the bound (`DiskFull` past it), checked
        and counted in one transaction with the job's keys."""
        size = stored_size(items, segments)
        job_key = self._key("job", job.id)
        per_item = {i.index: 0 for i in items}
        for segment in segments:
            if segment.item in per_item:  # (a segment of no item is not counted)
                per_item[segment.item] += 1
        fields = _job_fields(job, size) | {"seg_total": sum(per_item.values()), "seg_done": 0,
                                           "audio_seconds": "0"}
        item_rows: dict[FieldT, EncodableT] = {str(i.index): json.dumps({
            "title": i.title, "text": i.text, "options": dataclasses.asdict(i.options),
            "asked": i.asked, "error": i.error or None, "sample_rate": i.sample_rate,
            "reading": i.reading}) for i in items}
        where = _ranges((s.item, s.seq) for s in segments)
        meta_rows: dict[FieldT, EncodableT] = {
            str(i.index): _meta(i.title, len(i.text), dataclasses.asdict(i.options),
                                i.error or None, i.sample_rate, where.get(i.index, []))
            for i in items}
        tally = _tally({i: (n, 0, 0) for i, n in per_item.items()})
        segment_rows: dict[FieldT, EncodableT] = {str(s.seq): json.dumps({
            "item": s.item, "part": s.part, "text": s.text, "offset": s.offset,
            "samples": None, "how": s.how}) for s in segments}

        def store(pipe: Pipeline) -> None:
            if pipe.exists(job_key):
                raise ValueError(f"A job {job.id} is already stored")
            used = int(pipe.get(self._used) or 0)
            if used + size > self.max_bytes:
                raise self._full(used, size)
            pipe.multi()
            pipe.hset(job_key, mapping=fields)
            if item_rows:
                pipe.hset(self._key("items", job.id), mapping=item_rows)
                pipe.hset(self._key("meta", job.id), mapping=meta_rows)
                pipe.hset(self._key("tally", job.id), mapping=tally)
            if segment_rows:
                pipe.hset(self._key("seg", job.id), mapping=segment_rows)
            pipe.zadd(self._index, {job.id: job.created})
            pipe.incrby(self._used, size)

        with self._reach():
            self._redis.transaction(store, self._used, job_key)

    # -- reading -----------------------------------------------------------------------------

    def job(self, job_id: str) -> Job | None:
        with self._reach():
            fields = self._redis.hgetall(self._key("job", job_id))
        return _job(job_id, fields) if fields else None

    def _all_jobs(self) -> list[Job]:
        """Every job, oldest first."""
        with self._reach():
            ids = [_text(i) for i in self._redis.zrange(self._index, 0, -1)]
            pipe = self._redis.pipeline(transaction=False)
            for job_id in ids:
                pipe.hgetall(self._key("job", job_id))
            rows = pipe.execute()
        return [_job(job_id, fields) for job_id, fields in zip(ids, rows, strict=True) if fields]

    def jobs(self, owner: str | None = None, status: tuple[str, ...] | None = None
             ) -> list[Job]:
        return [j for j in self._all_jobs()
                if (owner is None or j.owner == owner) and (not status or j.status in status)]

    def recent(self, owner: str, limit: int, after: str | None = None) -> list[Job]:
        """The owner's jobs, newest first: at most `limit`, those made before job `after`
        (its id; none when it is not the owner's). The index is walked from the newest down,
        a page of owners at a time, until `limit` are found."""
        found: list[Job] = []
        with self._reach():
            at = 0
            if after is not None:
                rank = self._redis.zrevrank(self._index, after)
                if not isinstance(rank, int):
                    return []
                at = rank + 1
            while len(found) < limit:
                ids = [_text(i) for i in self._redis.zrevrange(self._index, at, at + 255)]
                if not ids:
                    break
                at += len(ids)
                pipe = self._redis.pipeline(transaction=False)
                for job_id in ids:
                    pipe.hget(self._key("job", job_id), "owner")
                mine = [job_id for job_id, who in zip(ids, pipe.execute(), strict=True)
                        if who is not None and _text(who) == owner][:limit - len(found)]
                pipe = self._redis.pipeline(transaction=False)
                for job_id in mine:
                    pipe.hgetall(self._key("job", job_id))
                found += [_job(job_id, fields)
                          for job_id, fields in zip(mine, pipe.execute(), strict=True) if fields]
        return found

    def items(self, job_id: str) -> list[Item]:
        with self._reach():
            rows = self._redis.hgetall(self._key("items", job_id))
        items = []
        for index, raw in sorted(rows.items(), key=lambda row: int(row[0])):
            item = json.loads(raw)
            items.append(Item(int(index), item["title"], item["text"],
                              ItemOptions(**item["options"]), item["asked"], item["error"],
                              item["sample_rate"], item.get("reading")))
        return items

    def item(self, job_id: str, index: int) -> Item | None:
        """One item (its text included), read by its index."""
        with self._reach():
            raw = self._redis.hget(self._key("items", job_id), str(index))
        if raw is None:
            return None
        item = json.loads(raw)
        return Item(index, item["title"], item["text"], ItemOptions(**item["options"]),
                    item["asked"], item["error"], item["sample_rate"], item.get("reading"))

    def item_count(self, job_id: str) -> int:
        with self._reach():
            return int(self._redis.hlen(self._key("items", job_id)))

    def _segment_rows(self, job_id: str) -> list[tuple[int, dict[str, Any]]]:
        with self._reach():
            rows = self._redis.hgetall(self._key("seg", job_id))
        return sorted((int(seq), json.loads(raw)) for seq, raw in rows.items())

    def segments(self, job_id: str, item: int | None = None) -> list[Segment]:
        """The job's segments, or one item's (read by their seqs: `segments_at`)."""
        if item is None:
            rows = self._segment_rows(job_id)
        else:
            seqs = [str(seq) for first, count in self._segments_at(job_id, item)
                    for seq in range(first, first + count)]
            if not seqs:
                return []
            with self._reach():
                found = self._redis.hmget(self._key("seg", job_id), seqs)
            rows = [(int(seq), json.loads(raw)) for seq, raw in zip(seqs, found, strict=True)
                    if raw is not None]
        return [Segment(seq, s["item"], s["part"], s["text"], s["offset"], s["samples"],
                        s.get("how")) for seq, s in rows]

    def _segments_at(self, job_id: str, item: int) -> list[list[int]]:
        """Where an item's segments are (`[[first seq, count], ...]`), from its `meta:`; a job
        stored before they were kept there is read whole once to keep them (`_count_old`: one
        stored before counts were kept; `_index_old`: one stored after)."""
        key = self._key("meta", job_id)
        for attempt in range(2):
            with self._reach():
                raw = self._redis.hget(key, str(item))
            meta = json.loads(raw) if raw is not None else None
            if meta is not None and "segments_at" in meta:
                return list(meta["segments_at"])
            if attempt:
                break
            if meta is None:
                if not self._count_old(job_id):  # no such job (else: no such item)
                    return []
            else:
                self._index_old(job_id)
        return []

    def _index_old(self, job_id: str) -> None:
        """Keep each item's segment seqs in its `meta:` for a job stored before they were
        kept, from one read of all its segments (which items they belong to never changes)."""
        meta_key, seg_key = self._key("meta", job_id), self._key("seg", job_id)

        def index(pipe: Pipeline) -> None:
            metas = pipe.hgetall(meta_key)
            if not metas:
                return
            where = _ranges((json.loads(raw)["item"], int(seq))
                            for seq, raw in pipe.hgetall(seg_key).items())
            pipe.multi()
            pipe.hset(meta_key, mapping={
                index: json.dumps(json.loads(raw) | {"segments_at": where.get(int(index), [])})
                for index, raw in metas.items()})

        with self._reach():
            self._redis.transaction(index, meta_key)

    def counts(self, job_id: str) -> tuple[int, int, float]:
        """(segments done, segments in all, seconds of audio stored), as counted."""
        key = self._key("job", job_id)
        with self._reach():
            done, total, seconds = self._redis.hmget(key, COUNTS)
        if total is None:  # no such job, or one the previous version stored
            if not self._count_old(job_id):
                return 0, 0, 0.0
            with self._reach():
                done, total, seconds = self._redis.hmget(key, COUNTS)
        return int(done or 0), int(total or 0), float(seconds or 0)

    def summaries(self, job_id: str, start: int = 0, limit: int | None = None
                  ) -> list[ItemSummary]:
        """Each item without its text, with its counts: from item `start`, at most `limit`
        (a card of many thousands is read a page at a time)."""
        counted, metas, tally = self._summary_rows(job_id, start, limit)
        if not counted:
            if not self._count_old(job_id):
                return []
            counted, metas, tally = self._summary_rows(job_id, start, limit)
        out = []
        for index, raw in sorted(metas.items(), key=lambda row: int(row[0])):
            meta, n = json.loads(raw), _text(index)
            out.append(ItemSummary(
                int(n), meta["title"], meta["chars"], ItemOptions(**meta["options"]),
                meta["error"], meta["sample_rate"], int(tally.get(f"{n}:segments", 0)),
                int(tally.get(f"{n}:done", 0)), int(tally.get(f"{n}:samples", 0))))
        return out

    def _summary_rows(self, job_id: str, start: int = 0, limit: int | None = None
                      ) -> tuple[bool, dict[Any, Any], dict[str, Any]]:
        """Whether the job is counted, and its items' `meta:` and `tally:` fields (all of them,
        or those of items `start` to `start + limit`: a job's items are numbered from 0)."""
        meta_key, tally_key = self._key("meta", job_id), self._key("tally", job_id)
        with self._reach():
            pipe = self._redis.pipeline(transaction=False)
            pipe.hexists(self._key("job", job_id), "seg_total")
            if limit is None:
                pipe.hgetall(meta_key)
                pipe.hgetall(tally_key)
                counted, metas, tally = pipe.execute()
                return bool(counted), metas, {_text(k): v for k, v in tally.items()}
            indexes = [str(n) for n in range(start, start + limit)]
            fields = [f"{n}:{count}" for n in indexes for count in ("segments", "done", "samples")]
            pipe.hmget(meta_key, indexes)
            pipe.hmget(tally_key, fields)
            counted, found, counts = pipe.execute()
        return (bool(counted), {n: raw for n, raw in zip(indexes, found, strict=True) if raw},
                {f: v for f, v in zip(fields, counts, strict=True) if v is not None})

    def _count_old(self, job_id: str) -> bool:
        """Count a job the previous version stored (no counts kept), once, from its items and
        segments; in a transaction that starts over when a segment is stored meanwhile. False
        when there is no such job."""
        job_key, items_key, seg_key = (self._key(kind, job_id) for kind in ("job", "items", "seg"))
        found = False

        def count(pipe: Pipeline) -> None:
            nonlocal found
            found = bool(pipe.exists(job_key))
            if not found or pipe.hexists(job_key, "seg_total"):
                return
            items = {int(k): json.loads(v) for k, v in pipe.hgetall(items_key).items()}
            per_item = {index: [0, 0, 0] for index in items}
            seconds: list[float] = []
            rows = [(int(seq), json.loads(raw)) for seq, raw in pipe.hgetall(seg_key).items()]
            where = _ranges((segment["item"], seq) for seq, segment in rows)
            for _seq, segment in rows:
                counts = per_item.get(segment["item"])
                if counts is None:  # (a segment of no item is not counted)
                    continue
                counts[0] += 1
                if segment["samples"] is not None:
                    counts[1] += 1
                    counts[2] += segment["samples"]
                    if rate := items[segment["item"]]["sample_rate"]:
                        seconds.append(segment["samples"] / rate)
            pipe.multi()
            if items:
                pipe.hset(self._key("meta", job_id), mapping={str(index): _meta(
                    item["title"], len(item["text"]), item["options"], item["error"],
                    item["sample_rate"], where.get(index, [])) for index, item in items.items()})
                pipe.hset(self._key("tally", job_id), mapping=_tally(
                    {index: (n, d, s) for index, (n, d, s) in per_item.items()}))
            pipe.hset(job_key, mapping={
                "seg_total": sum(c[0] for c in per_item.values()),
                "seg_done": sum(c[1] for c in per_item.values()),
                "audio_seconds": repr(math.fsum(seconds))})

        with self._reach():
            self._redis.transaction(count, job_key, items_key, seg_key)
        return found

    def words(self, job_id: str, item: int) -> list[list[WordRow]]:
        seqs = [s.seq for s in self.segments(job_id, item)]
        if not seqs:
            return []
        with self._reach():
            rows = self._redis.hmget(self._key("words", job_id), [str(s) for s in seqs])
        return [[tuple(w) for w in json.loads(raw)] if raw else [] for raw in rows]

    def audio(self, job_id: str, seq: int) -> npt.NDArray[np.float32]:
        """A finished segment's samples, exactly as encoders turn them back into 16 bits."""
        with self._reach():
            data = self._redis.get(self._audio_key(job_id, seq))
        if not isinstance(data, bytes):  # None: as JobStore's missing file
            raise FileNotFoundError(f"No audio is stored for segment {seq} of job {job_id}")
        pcm = np.frombuffer(data, dtype="<i2")
        return pcm.astype(np.float32) / np.float32(32767.0)

    def file(self, job_id: str, name: str) -> Path:
        """This process's own copy of a file made from the job (its ZIP)."""
        path = self.cache / job_id / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    # -- writing -----------------------------------------------------------------------------

    def set_status(self, job_id: str, status: JobStatus, error: dict[str, Any] | None = None
                   ) -> None:
        now = time.time()
        finished = repr(now) if status in FINISHED else ""
        with self._reach():
            self._update_job(keys=[self._key("job", job_id)], args=[
                "status", status, "updated", repr(now), "finished", finished,
                "error", json.dumps(error) if error else ""])

    def set_item(self, job_id: str, index: int, *, sample_rate: int | None = None,
                 error: dict[str, Any] | None = None) -> None:
        changes: dict[str, Any] = {}
        if sample_rate is not None:
            changes["sample_rate"] = sample_rate
        if error is not None:
            changes["error"] = error
        if not changes:
            return
        self._count_old(job_id)  # (one the previous version stored: its summaries change too)
        key, meta_key, tally_key, job_key = (self._key(kind, job_id)
                                             for kind in ("items", "meta", "tally", "job"))

        def update(pipe: Pipeline) -> None:
            raw = pipe.hget(key, str(index))
            if raw is None:  # no such item (or job): nothing to change
                return
            item = json.loads(raw) | changes
            kept = pipe.hget(meta_key, str(index))
            where = json.loads(kept).get("segments_at") if kept is not None else None
            seconds = None
            if sample_rate is not None:  # its audio, counted anew at its new rate
                rates = {_text(k): json.loads(v)["sample_rate"]
                         for k, v in pipe.hgetall(meta_key).items()} | {str(index): sample_rate}
                tally = {_text(k): int(v) for k, v in pipe.hgetall(tally_key).items()}
                seconds = math.fsum(tally.get(f"{n}:samples", 0) / rate
                                    for n, rate in rates.items() if rate)
            pipe.multi()
            pipe.hset(key, str(index), json.dumps(item))
            pipe.hset(meta_key, str(index), _meta(item["title"], len(item["text"]),
                                                  item["options"], item["error"],
                                                  item["sample_rate"], where))
            if seconds is not None:
                pipe.hset(job_key, "audio_seconds", repr(seconds))

        with self._reach():
            self._redis.transaction(update, key, meta_key, tally_key, job_key)

    def finish_segment(self, job_id: str, seq: int, pcm16: bytes, words: list[WordRow]
                       ) -> None:
        """Store one rendered segment: its audio, then its being done, in one atomic step
        counted against the shared bound. `DiskFull` when the bound (or Redis's memory) has no
        room: nothing of the segment is left behind. `JobNotFound` once the job is deleted."""
        seg_key = self._key("seg", job_id)
        with self._reach():
            raw = self._redis.hget(seg_key, str(seq))
        if raw is None:
            raise JobNotFound(f"Job {job_id} has no segment {seq} (deleted?)")
        segment = json.loads(raw) | {"samples": len(pcm16) // 2}
        keys = [self._used, self._key("job", job_id), seg_key, self._key("words", job_id),
                self._audio_key(job_id, seq), self._key("meta", job_id),
                self._key("tally", job_id)]
        args: list[EncodableT] = [seq, json.dumps(segment), json.dumps(words) if words else "",
                                  pcm16, self.max_bytes, repr(time.time()), len(pcm16) // 2]
        with self._reach():
            outcome, used = self._finish(keys=keys, args=args)
        if outcome == 0:
            raise JobNotFound(f"Job {job_id} has no segment {seq} (deleted?)")
        if outcome < 0:
            raise self._full(int(used), len(pcm16))

    def add_file(self, job_id: str, name: str, size: int) -> None:
        """A file made from the job in this process's cache (its ZIP): it is this process's
        own, outside the shared bound, so nothing is counted."""

    def reserve(self, size: int) -> None:
        """`DiskFull` unless the shared bound has room for `size` more bytes; counts nothing
        (only this process's own files are reserved from outside: see `add_file`)."""
        used = self.used
        if used + size > self.max_bytes:
            raise self._full(used, size)

    def unreserve(self, size: int) -> None:
        """Nothing to give back: `reserve` counts nothing."""

    def delete(self, job_id: str) -> None:
        """Remove every key of the job (its lease too) and give its bytes back, at once; and
        this process's cached files of it."""
        keys = [self._key(kind, job_id)
                for kind in ("job", "items", "seg", "words", "lease", "meta", "tally")]
        with self._reach():
            self._delete(keys=[*keys, self._index, self._used],
                         args=[f"{self.prefix}audio:{job_id}:", job_id])
        shutil.rmtree(self.cache / job_id, ignore_errors=True)

    def expired(self, older_than: float) -> list[str]:
        """Finished jobs that ended before `older_than` (a time.time())."""
        return [j.id for j in self._all_jobs()
                if j.finished is not None and j.finished < older_than]

    def interrupted(self) -> list[str]:
        """Jobs queued or running (here: in any process), oldest first."""
        return [j.id for j in self._all_jobs() if j.status in ("queued", "running")]

    def prune(self) -> None:
        """Remove this process's cached files of jobs deleted by any process (a purge sent to
        another process, retention there)."""
        if not self.cache.is_dir():
            return
        for folder in self.cache.iterdir():
            if self.job(folder.name) is None:
                shutil.rmtree(folder, ignore_errors=True)

    # -- leases ------------------------------------------------------------------------------

    def claim(self, job_id: str, worker: str, ttl_s: float) -> bool:
        """Take the job's lease for `ttl_s` seconds: True if it was free (or already this
        worker's: then it is extended), False if another worker holds it or there is no such
        job."""
        with self._reach():
            return bool(self._claim(keys=[self._key("lease", job_id), self._key("job", job_id)],
                                    args=[worker, _ms(ttl_s)]))

    def renew(self, job_id: str, worker: str, ttl_s: float) -> bool:
        """Extend the lease to `ttl_s` seconds from now, only if `worker` still holds it."""
        with self._reach():
            return bool(self._renew(keys=[self._key("lease", job_id)], args=[worker, _ms(ttl_s)]))

    def release(self, job_id: str, worker: str) -> None:
        """Give the lease back, only if `worker` holds it."""
        with self._reach():
            self._release(keys=[self._key("lease", job_id)], args=[worker])

    def claimable(self) -> list[str]:
        """Jobs queued or running that no live lease holds, oldest first."""
        waiting = self.interrupted()
        with self._reach():
            pipe = self._redis.pipeline(transaction=False)
            for job_id in waiting:
                pipe.exists(self._key("lease", job_id))
            leased = pipe.execute()
        return [job_id for job_id, held in zip(waiting, leased, strict=True) if not held]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def _public_url(url: str) -> str:
    """The URL without its credentials or options, fit for messages."""
    parts = urlsplit(url)
    if parts.hostname is None:
        return f"{parts.scheme}://{parts.path}"
    host = f"{parts.hostname}:{parts.port}" if parts.port else parts.hostname
    return f"{parts.scheme}://{host}{parts.path}"


def _job_fields(job: Job, size: int) -> dict[FieldT, EncodableT]:
    """A new job as JobStore stores one: not yet finished, no error, `size` bytes."""
    return {"owner": job.owner, "kind": job.kind, "status": job.status,
            "request": json.dumps(job.request), "created": repr(float(job.created)),
            "updated": repr(float(job.updated)), "finished": "", "error": "", "bytes": size}


def _meta(title: str, chars: int, options: dict[str, Any], error: dict[str, Any] | None,
          sample_rate: int | None, segments_at: list[list[int]] | None = None) -> str:
    """An item as a card shows it, without its text; and where its segments are (left out:
    not known yet, for a job stored before they were kept)."""
    meta = {"title": title, "chars": chars, "options": options, "error": error,
            "sample_rate": sample_rate}
    if segments_at is not None:
        meta["segments_at"] = segments_at
    return json.dumps(meta)


def _ranges(owners: Iterable[tuple[int, int]]) -> dict[int, list[list[int]]]:
    """Each item's segment seqs, from (item, seq) pairs, as runs `[first, count]` (a job's
    items each have one run: their segments were cut in order)."""
    runs: dict[int, list[list[int]]] = {}
    for item, seq in sorted(owners, key=lambda pair: pair[1]):
        mine = runs.setdefault(item, [])
        if mine and mine[-1][0] + mine[-1][1] == seq:
            mine[-1][1] += 1
        else:
            mine.append([seq, 1])
    return runs


def _tally(counts: Mapping[int, tuple[int, int, int]]) -> dict[FieldT, EncodableT]:
    """Each item's (segments, done, samples) as `tally:` fields."""
    fields: dict[FieldT, EncodableT] = {}
    for index, (segments, done, samples) in counts.items():
        fields |= {f"{index}:segments": segments, f"{index}:done": done,
                   f"{index}:samples": samples}
    return fields


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job(job_id: str, fields: Mapping[Any, Any]) -> Job:
    row = {_text(k): _text(v) for k, v in fields.items()}
    kind: JobKind = row["kind"]  # type: ignore[assignment]
    status: JobStatus = row["status"]  # type: ignore[assignment]
    return Job(id=job_id, owner=row["owner"], kind=kind, status=status,
               created=float(row["created"]), updated=float(row["updated"]),
               request=json.loads(row["request"]),
               finished=float(row["finished"]) if row["finished"] else None,
               error=json.loads(row["error"]) if row["error"] else None,
               bytes=int(row["bytes"]))
