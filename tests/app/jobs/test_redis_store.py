"""`RedisJobStore` against a real redis-server: the same answers as `JobStore` for the same calls
(both run side by side), one bound shared by every store on the same Redis, leases that let
exactly one worker run a job and another take it over once the first stops renewing, a deleted
job leaving no key behind, and Redis out of reach as `StoreUnavailable`."""

from __future__ import annotations

import itertools
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from app.jobs.model import (
    DiskFull,
    Item,
    ItemOptions,
    Job,
    JobNotFound,
    Segment,
    StoreUnavailable,
)
from app.jobs.redis_store import RedisJobStore
from app.jobs.results import job_zip
from app.jobs.store import JobStore
from tests.redisserver import redis_server

_PREFIXES = itertools.count()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis-jobs"), policy="noeviction") as url:
        yield url


@pytest.fixture
def prefix() -> str:
    """Each test its own keys on the module's server."""
    return f"test{next(_PREFIXES)}:jobs:"


def keys(url: str, prefix: str) -> set[str]:
    client = redis.Redis.from_url(url)
    try:
        return {k.decode() for k in client.scan_iter(match=f"{prefix}*")}
    finally:
        client.close()


def pcm(n: int, seed: int) -> bytes:
    samples = np.random.default_rng(seed).integers(-32768, 32768, n, dtype=np.int64)
    samples[:2] = (-32768, 32767)  # both ends of the range
    return samples.astype("<i2").tobytes()


def small_job(job_id: str, created: float = 1.0, status: str = "queued", segments: int = 1,
              text: str = "Hello.") -> tuple[Job, list[Item], list[Segment]]:
    job = Job(job_id, "anonymous", "book", status, created, created, {})  # type: ignore[arg-type]
    items = [Item(0, "", text, ItemOptions("espeak"), sample_rate=22050)]
    return job, items, [Segment(n, 0, n, text, 0) for n in range(segments)]


CHAPTERS = ["Call me Ishmael. Some years ago, never mind how long precisely.",
            "It is a way I have of driving off the spleen, and regulating the circulation."]


def book(job_id: str, created: float, owner: str) -> tuple[Job, list[Item], list[Segment]]:
    job = Job(job_id, owner, "book", "queued", created, created,
              {"model": "espeak", "voice": "en-us", "title": "Moby-Dick", "speed": 1.25})
    items = [
        Item(0, "Loomings", CHAPTERS[0], ItemOptions("espeak", "en-us", response_format="wav"),
             {"model": "espeak", "voice": "en-us"}),
        Item(1, "The Carpet-Bag", CHAPTERS[1],
             ItemOptions("espeak", "en-us", 1.25, "en", "slowly", "wav"), {"model": "espeak"}),
        Item(2, "Nothing", "Not spoken.", ItemOptions("nope"), {"model": "nope"},
             error={"message": "No model 'nope'", "type": "invalid_request_error"}),
        Item(3, "Empty", "", ItemOptions("espeak"), {}, error={}),
    ]
    cut = CHAPTERS[0].index("Some")
    segments = [Segment(0, 0, 0, CHAPTERS[0][:cut], 0), Segment(1, 0, 1, CHAPTERS[0][cut:], cut),
                Segment(2, 1, 0, CHAPTERS[1], 0)]
    return job, items, segments


def shape(job: Job | None) -> dict[str, Any] | None:
    """A job without the times the stores take from the clock themselves."""
    if job is None:
        return None
    fields = asdict(job)
    fields["updated"] = None
    fields["finished"] = job.finished is not None
    return fields


def test_the_same_calls_give_the_same_answers_as_the_sqlite_store(
        redis_url: str, prefix: str, tmp_path: Path) -> None:
    disk = JobStore(tmp_path / "disk", max_bytes=10_000_000)
    shared = RedisJobStore(redis_url, tmp_path / "redis", max_bytes=10_000_000, prefix=prefix)
    stores = (disk, shared)
    words = [("Call", 0.1 + 0.2, 0.55, 0, 4), ("me", 0.55, 1 / 3, 5, 7)]

    def both(call: str, *args: Any, **kwargs: Any) -> Any:
        first, second = (getattr(store, call)(*args, **kwargs) for store in stores)
        return first, second

    for job_id, created, owner in (("job_a", 1000.5, "alice"), ("job_b", 999.25, "bob"),
                                   ("job_c", 1001.0, "alice")):
        both("create", *book(job_id, created, owner))
    both("set_item", "job_a", 0, sample_rate=22050)
    both("set_item", "job_a", 1, sample_rate=24000)
    both("set_item", "job_a", 2, error={"message": "later", "type": "server_error"})
    both("set_item", "job_a", 9, sample_rate=16000)  # no such item: nothing changes
    both("set_status", "job_a", "running")
    both("set_status", "job_b", "failed", {"message": "broken", "code": "disk_full"})
    both("set_status", "job_missing", "done")  # no such job: nothing stored
    both("set_item", "job_missing", 0, sample_rate=16000)
    both("finish_segment", "job_a", 0, pcm(2205, 1), words)
    both("finish_segment", "job_a", 2, pcm(4801, 2), [])
    both("finish_segment", "job_b", 2, pcm(100, 7), [])  # its item has no sample rate yet

    def same(call: str, *args: Any, **kwargs: Any) -> Any:
        first, second = both(call, *args, **kwargs)
        assert first == second, (call, args, kwargs)
        return second

    for job_id in ("job_a", "job_b", "job_c", "job_missing"):
        first, second = both("job", job_id)
        assert shape(first) == shape(second)
        assert same("items", job_id) is not None
        same("segments", job_id)
    for owner, status in ((None, None), ("alice", None), (None, ("queued",)),
                          ("alice", ("running", "failed")), ("bob", ("failed",)), ("eve", None)):
        first, second = both("jobs", owner, status)
        assert [shape(j) for j in first] == [shape(j) for j in second]
    assert [j.id for j in shared.jobs()] == ["job_b", "job_a", "job_c"]
    assert same("segments", "job_a", 0)[0].samples == 2205
    same("segments", "job_a", 1)
    same("segments", "job_a", 7)
    done, total, seconds = shared.counts("job_a")
    first = disk.counts("job_a")
    assert (done, total) == first[:2] == (2, 3)
    assert seconds == pytest.approx(first[2], rel=1e-12, abs=0)
    assert same("counts", "job_b") == (1, 3, 0.0)
    assert same("counts", "job_missing") == (0, 0, 0.0)
    assert same("words", "job_a", 0) == [[tuple(w) for w in words], []]
    same("words", "job_a", 1)
    same("words", "job_a", 2)
    for seq in (0, 2):
        first, second = both("audio", "job_a", seq)
        assert second.dtype == first.dtype == np.float32
        assert np.array_equal(first, second)
    assert same("interrupted") == ["job_a", "job_c"]
    both("set_status", "job_c", "done")
    assert same("expired", time.time() + 1) == ["job_b", "job_c"]
    assert same("expired", time.time() - 3600) == []
    assert disk.used == shared.used and shared.job("job_a").bytes > 2 * (2205 + 4801)  # type: ignore[union-attr]

    # The finished job's ZIP, made from each store's segments, holds the same files.
    both("finish_segment", "job_a", 1, pcm(1000, 3), [("Some", 0.0, 0.25, 0, 4)])
    both("set_status", "job_a", "done")
    zips = [job_zip(store, store.job("job_a")) for store in stores]  # type: ignore[arg-type]
    assert zips[1] == tmp_path / "redis" / "jobs-cache" / "job_a" / "result.zip"
    contents = []
    for path in zips:
        with zipfile.ZipFile(path) as archive:
            contents.append({name: archive.read(name) for name in archive.namelist()})
    assert contents[0] == contents[1]
    assert sorted(contents[1]) == ["001.srt", "001.vtt", "001.wav", "002.wav", "manifest.json"]
    # The ZIP is this process's own file: it is not counted in the shared bound.
    assert shared.used == disk.used - zips[0].stat().st_size
    both("delete", "job_a")
    assert disk.used == shared.used
    assert not (tmp_path / "redis" / "jobs-cache" / "job_a").exists()
    disk.close()
    shared.close()


def test_the_bound_is_shared_by_every_store_on_the_same_redis(
        redis_url: str, prefix: str, tmp_path: Path) -> None:
    one = RedisJobStore(redis_url, tmp_path / "one", max_bytes=1012, prefix=prefix)
    other = RedisJobStore(redis_url, tmp_path / "other", max_bytes=1012, prefix=prefix)
    one.create(*small_job("job_a", segments=3))  # 6 bytes as the item, 6 as each segment
    assert one.used == other.used == 24
    other.finish_segment("job_a", 0, b"\1\0" * 300, [])
    assert one.used == 624 and one.job("job_a").bytes == 624  # type: ignore[union-attr]
    one.reserve(388)  # fits: checked, counted by nobody (a process's own ZIP)
    with pytest.raises(DiskFull) as full:
        other.reserve(389)
    assert full.value.code == "disk_full"
    with pytest.raises(DiskFull):
        one.finish_segment("job_a", 1, b"\0\0" * 200, [])
    assert other.used == 624 and other.counts("job_a")[:2] == (1, 3)
    assert other.segments("job_a")[1].samples is None
    assert not any(k.endswith(":1") for k in keys(redis_url, prefix))  # no audio left behind
    with pytest.raises(DiskFull):
        other.create(*small_job("job_big", text="A long chapter. " * 20))
    assert one.job("job_big") is None and one.used == 624
    # Storing a segment again replaces it: counted once.
    one.finish_segment("job_a", 0, b"\1\0" * 350, [])
    assert other.used == 724 and other.counts("job_a")[0] == 1
    one.delete("job_a")
    assert other.used == 0
    one.close()
    other.close()


def test_concurrent_segments_never_pass_the_bound(
        redis_url: str, prefix: str, tmp_path: Path) -> None:
    stores = [RedisJobStore(redis_url, tmp_path / str(n), max_bytes=1012, prefix=prefix)
              for n in range(2)]
    stores[0].create(*small_job("job_a", segments=40, text="x"))  # 41 bytes
    stored: list[int] = []
    refused: list[int] = []

    def finish(worker: int) -> None:
        for seq in range(worker, 40, 8):
            try:
                stores[worker % 2].finish_segment("job_a", seq, b"\0" * 100, [])
                stored.append(seq)
            except DiskFull:
                refused.append(seq)

    threads = [threading.Thread(target=finish, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(stored) == 9 and len(refused) == 31
    assert stores[1].used == 941 and stores[0].counts("job_a")[0] == 9
    assert {s.seq for s in stores[1].segments("job_a") if s.samples} == set(stored)


def test_one_worker_holds_a_job_until_its_lease_runs_out(
        redis_url: str, prefix: str, tmp_path: Path) -> None:
    one = RedisJobStore(redis_url, tmp_path / "one", max_bytes=10_000, prefix=prefix)
    other = RedisJobStore(redis_url, tmp_path / "other", max_bytes=10_000, prefix=prefix)
    one.create(*small_job("job_b", created=2.0))
    one.create(*small_job("job_a", created=1.0, status="running"))
    one.create(*small_job("job_done", created=0.5, status="done"))
    assert other.claimable() == ["job_a", "job_b"]
    assert one.claim("job_a", "w1", 0.3)
    assert not other.claim("job_a", "w2", 0.3)
    assert one.claim("job_a", "w1", 0.3)  # the holder again: still its own
    assert other.claimable() == ["job_b"]
    assert not other.renew("job_a", "w2", 5) and not other.renew("job_b", "w2", 5)
    other.release("job_a", "w2")  # not the holder: nothing happens
    assert not other.claim("job_a", "w2", 0.3)
    time.sleep(0.2)
    assert one.renew("job_a", "w1", 0.3)
    time.sleep(0.2)  # past the first lease's end, within the renewed one
    assert not other.claim("job_a", "w2", 0.3)
    time.sleep(0.25)  # the holder stopped renewing: another takes over
    assert other.claimable() == ["job_a", "job_b"]
    assert other.claim("job_a", "w2", 5)
    assert not one.renew("job_a", "w1", 5) and not one.claim("job_a", "w1", 5)
    one.release("job_a", "w1")
    assert one.claimable() == ["job_b"]
    other.release("job_a", "w2")
    assert one.claim("job_a", "w1", 5)
    assert not one.claim("job_missing", "w1", 5)
    one.set_status("job_b", "cancelled")
    assert other.claimable() == []


def test_delete_removes_every_key_of_the_job_and_releases_its_bytes(
        redis_url: str, prefix: str, tmp_path: Path) -> None:
    store = RedisJobStore(redis_url, tmp_path, max_bytes=100_000, prefix=prefix)
    for job_id in ("job_a", "job_b"):
        store.create(*small_job(job_id, segments=2))
        store.finish_segment(job_id, 0, pcm(500, 4), [("Hello", 0.0, 0.4, 0, 5)])
        store.finish_segment(job_id, 1, pcm(300, 5), [])
        assert store.claim(job_id, "w1", 30)
    store.file("job_a", "result.zip").write_bytes(b"PK")
    before = keys(redis_url, prefix)
    assert len([k for k in before if "job_a" in k]) >= 6  # job, items, segments, 2 audio, lease
    assert store.used == 2 * (1600 + 18)
    store.delete("job_a")
    assert store.job("job_a") is None and store.used == 1618
    assert not (tmp_path / "jobs-cache" / "job_a").exists()
    assert {k for k in keys(redis_url, prefix) if "job_a" in k} == set()
    assert keys(redis_url, prefix) == {k for k in before if "job_a" not in k}
    assert [j.id for j in store.jobs()] == ["job_b"] and store.claimable() == []
    store.delete("job_a")  # twice: nothing more released
    with pytest.raises(JobNotFound):  # a worker still rendering a job deleted elsewhere
        store.finish_segment("job_a", 0, pcm(500, 4), [])
    assert {k for k in keys(redis_url, prefix) if "job_a" in k} == set() and store.used == 1618
    store.delete("job_b")
    assert keys(redis_url, prefix) == set() and store.used == 0


def test_redis_out_of_reach_is_store_unavailable(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis", policy="noeviction") as url:
        store = RedisJobStore(url, tmp_path / "data", max_bytes=10_000)
        store.create(*small_job("job_a"))
        assert store.job("job_a") is not None
    calls = [lambda: store.job("job_a"), lambda: store.used, store.interrupted,
             lambda: store.finish_segment("job_a", 0, b"\0\0", []),
             lambda: store.claim("job_a", "w1", 1)]
    for call in calls:
        with pytest.raises(StoreUnavailable) as gone:
            call()
        assert gone.value.code == "job_store_unavailable"
        assert "Redis" in gone.value.message and "127.0.0.1" in gone.value.message
    store.close()
    with pytest.raises(StoreUnavailable) as never:
        RedisJobStore(url.replace("redis://", "redis://:secret@"), tmp_path, max_bytes=1)
    assert "secret" not in never.value.message


def test_redis_out_of_memory_is_disk_full(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis", maxmemory="3mb", policy="noeviction") as url:
        store = RedisJobStore(url, tmp_path / "data", max_bytes=10**9)
        store.create(*small_job("job_a", segments=20))
        with pytest.raises(DiskFull) as full:
            for seq in range(20):
                store.finish_segment("job_a", seq, pcm(250_000, seq), [])
        assert full.value.code == "disk_full" and "maxmemory" in full.value.message
        done = store.counts("job_a")[0]
        assert 0 < done < 20 and store.used == 6 * 21 + done * 500_000
        stored = {k for k in keys(url, "voxmux:jobs:") if ":audio:" in k}
        assert len(stored) == done
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_an_ended_job_keeps_its_status(kind: str, redis_url: str, prefix: str,
                                       tmp_path: Path) -> None:
    """Done, failed and cancelled are final: a cancel from another process is never turned
    back into `done` or `running` by the process that was running the job."""
    store: Any = (JobStore(tmp_path, 10**6) if kind == "sqlite"
                  else RedisJobStore(redis_url, tmp_path, 10**6, prefix))
    try:
        store.create(*small_job("job_final"))
        store.set_status("job_final", "running")
        store.set_status("job_final", "cancelled")
        for later in ("running", "done", "failed"):
            store.set_status("job_final", later)
            assert store.job("job_final").status == "cancelled"
        assert store.job("job_final").finished is not None
    finally:
        store.close()
