"""The Redis job store reads one item's segments, not the whole job's, for each item: rendering a
job of many items, and reading its chapters, costs Redis traffic in proportion to the job (a job
of 30,000 items rendered 17 items in 34 s when every item read every segment). A job stored
before the store kept each item's range is read whole once, then by range."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.jobs.model import Item, ItemOptions, Job, Segment
from app.jobs.redis_store import RedisJobStore
from tests.conftest import decode, start_server, test_settings
from tests.redisserver import redis_server

ITEMS = 300


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis-items"), maxmemory="256mb",
                      policy="noeviction") as url:
        yield url


def sent(url: str) -> int:
    """Bytes the Redis server has sent its clients since it started."""
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_net_output_bytes"])
    finally:
        client.close()


def test_a_job_of_many_items_reads_each_items_segments_only(redis_url: str,
                                                            tmp_path: Path) -> None:
    live = start_server(test_settings(
        tmp_path, preload=["espeak"], idle_ttl=-1, data_dir=tmp_path / "data",
        jobs_store="redis", cache_url=redis_url, cache_max_items=0))
    try:
        with live.client() as client:
            before = sent(redis_url)
            answer = client.post("/v1/audio/jobs", json={
                "model": "espeak", "voice": "en-us", "response_format": "wav",
                "items": [{"input": "Hello there."}] * ITEMS})
            assert answer.status_code == 202, answer.text
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:  # (a card without its chapters: a few bytes)
                time.sleep(0.2)
                if client.get("/v1/audio/jobs", params={"limit": 1}).json()["data"][0][
                        "status"] not in ("queued", "running"):
                    break
            done = client.get(f"/v1/audio/jobs/{answer.json()['id']}").json()
            assert done["status"] == "done", done["progress"]
            for chapter in (done["chapters"][0], done["chapters"][-1]):
                audio = client.get(chapter["audio"])
                assert decode(audio.content, "wav").duration > 0.3
            traffic = sent(redis_url) - before
    finally:
        live.stop()
    # Every segment's JSON (about 120 bytes) read for each of 300 items, three times: 32 MB.
    print(f"Redis sent {traffic:,} bytes")
    assert traffic < 4_000_000, f"Redis sent {traffic:,} bytes"


def _job(store: RedisJobStore, job_id: str) -> None:
    job = Job(job_id, "anonymous", "book", "queued", 1.0, 1.0, {})
    items = [Item(n, f"T{n}", "Hello there. " * (n + 1), ItemOptions("espeak"), sample_rate=22050)
             for n in range(4)]
    segments, seq = [], 0
    for item in items:
        for part in range(item.index + 1):  # item n has n + 1 segments; item 2 none (failed)
            if item.index != 2:
                segments.append(Segment(seq, item.index, part, "Hello there.", 13 * part))
                seq += 1
    store.create(job, items, segments)


def test_a_job_stored_before_item_ranges_is_read_whole_once(redis_url: str,
                                                            tmp_path: Path) -> None:
    store = RedisJobStore(redis_url, tmp_path, 10**9, prefix="ranges:jobs:")
    try:
        _job(store, "job_new")
        _job(store, "job_old")
        client = redis.Redis.from_url(redis_url)
        meta = "ranges:jobs:meta:job_old"
        for index, raw in client.hgetall(meta).items():  # as the previous version stored it
            row = json.loads(raw)
            row.pop("segments_at", None)
            client.hset(meta, index, json.dumps(row))
        whole = store.segments("job_old")
        for job_id in ("job_new", "job_old"):
            by_item = [store.segments(job_id, n) for n in range(5)]
            assert [len(s) for s in by_item] == [1, 2, 0, 4, 0]
            assert [s for part in by_item for s in part] == store.segments(job_id)
            assert store.segments(job_id, 3)[1] == Segment(4, 3, 1, "Hello there.", 13)
        assert whole == store.segments("job_new")
        assert all("segments_at" in json.loads(raw) for raw in client.hgetall(meta).values())
        store.finish_segment("job_old", 4, b"\0\0" * 10, [("Hello", 0.0, 0.1, 0, 5)])
        assert store.segments("job_old", 3)[1].samples == 10
        assert store.words("job_old", 3) == [[], [("Hello", 0.0, 0.1, 0, 5)], [], []]
        store.set_item("job_old", 3, sample_rate=24000)
        assert store.segments("job_old", 3)[1].samples == 10  # its range kept
        client.close()
    finally:
        store.delete("job_new")
        store.delete("job_old")
        store.close()
