"""The Redis cache survives losing its index: under `allkeys-lru` (as the compose files configure
Redis) any key may be evicted, the index's too. Stores keep succeeding, reads keep working, and
the budgets hold again, with no store failing in between."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis

from app.serving.cache import CachedAudio
from app.serving.redis_cache import RedisCache
from tests.redisserver import redis_server

SECONDS = 0.25
RATE = 1000


def entry(n: int) -> CachedAudio:
    samples = np.full(int(SECONDS * RATE), n / 1000, dtype=np.float32)
    return CachedAudio.build("piper", RATE, [[samples]])


ONE = entry(0).nbytes


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(Path(tmp_path_factory.mktemp("redis-index"))) as url:
        yield url


@pytest.mark.parametrize("lost", [("lru",), ("sizes",), ("lru", "sizes"), ("meta",)])
async def test_stores_survive_the_index_deleted_under_load(redis_url: str,
                                                           lost: tuple[str, ...]) -> None:
    prefix = f"lost{random.randrange(10**9)}:"
    cache = RedisCache(redis_url, 100, 6 * ONE, 6 * ONE, prefix=prefix)
    other = aioredis.Redis.from_url(redis_url)
    failed: list[int] = []
    stop = asyncio.Event()

    async def store(worker: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            if not await cache.put(f"w{worker}-{n}", entry(n)):
                failed.append(n)

    async def delete_the_index() -> None:
        for _ in range(20):
            await asyncio.sleep(0.02)
            await other.delete(*(prefix + name for name in lost))

    workers = [asyncio.create_task(store(w)) for w in range(4)]
    await delete_the_index()
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*workers)

    assert cache.errors == 0 and not failed, f"{len(failed)} stores failed"
    for n in range(10):  # afterwards: stores succeed and what was stored is read back
        assert await cache.put(f"after-{n}", entry(n))
        found = await cache.get(f"after-{n}")
        assert found is not None and np.array_equal(found.chunks[0], entry(n).chunks[0])
    figures = await cache.snapshot()
    assert figures.errors == 0
    assert figures.items <= 6 and figures.bytes <= 6 * ONE
    sizes = await other.hgetall(prefix + "sizes")
    indexed = await other.zrange(prefix + "lru", 0, -1)
    assert set(sizes) == set(indexed)  # the index and the sizes agree again
    assert figures.bytes == sum(int(v) for v in sizes.values())
    await other.aclose()
    await cache.close()
