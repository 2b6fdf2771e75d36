"""Audio cache: LRU over item and byte budgets, in process and in a real redis-server; hits are
identical and never reach an engine."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import numpy as np
import pytest
import redis
from websockets.sync.client import connect

from app.serving.cache import AudioCache, CachedAudio, MemoryCache
from app.serving.record import RenderRecord
from app.serving.redis_cache import RedisCache
from engines.base import Engine
from tests.conftest import LiveServer, decode, free_port
from tests.redisserver import redis_server


def entry(model: str, seconds: float, rate: int = 1000) -> CachedAudio:
    samples = np.linspace(-0.5, 0.5, int(seconds * rate), dtype=np.float32)
    return CachedAudio.build(model, rate, [[samples[: len(samples) // 2]],
                                           [samples[len(samples) // 2:]]])


def key(text: str, **overrides: Any) -> str:
    fields: dict[str, Any] = {"model": "piper", "engine": "piper", "voice": "joe",
                              "native_speed": 1.0, "stretch": 1.0, "language": None,
                              "segments": (text,), "fingerprint": "f", "pause_ms": 250,
                              "code": "c"}
    fields.update(overrides)
    return RenderRecord(**fields).key()


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


Tier = Callable[[int, int, int], Awaitable[AudioCache]]


@pytest.fixture(params=["memory", "redis"])
async def tier(request: pytest.FixtureRequest) -> AsyncIterator[Tier]:
    """Builds a cache of the tier under test: the same budgets, the same behaviour."""
    made: list[AudioCache] = []

    async def make(max_items: int, max_bytes: int, max_item_bytes: int) -> AudioCache:
        cache: AudioCache
        if request.param == "memory":
            cache = MemoryCache(max_items, max_bytes, max_item_bytes)
        else:
            url = request.getfixturevalue("redis_url")
            cache = RedisCache(url, max_items, max_bytes, max_item_bytes,
                               prefix=f"test{random.randrange(10**9)}:")
        made.append(cache)
        return cache

    yield make
    for cache in made:
        await cache.close()


async def test_byte_budget_evicts_the_least_recently_used(tier: Tier) -> None:
    one = entry("piper", 1.0).nbytes  # 4000 bytes of float32
    cache = await tier(100, 3 * one, 3 * one)
    for name in "abc":
        assert await cache.put(name, entry("piper", 1.0))
    assert await cache.get("a") is not None  # a is now the most recently used
    await cache.put("d", entry("piper", 1.0))
    assert await cache.get("b") is None
    assert all([await cache.get(k) is not None for k in "acd"])
    figures = await cache.snapshot()
    assert figures.items == 3 and figures.bytes == 3 * one
    await cache.put("big", entry("piper", 2.0))  # needs two entries' room
    assert (await cache.snapshot()).bytes <= 3 * one and await cache.get("big") is not None
    assert await cache.get("a") is None and await cache.get("c") is None


async def test_item_budget_and_skip_threshold(tier: Tier) -> None:
    cache = await tier(2, 1 << 20, 10_000)
    for name in "abc":
        await cache.put(name, entry("piper", 1.0))
    assert (await cache.snapshot()).items == 2 and await cache.get("a") is None
    assert not await cache.put("huge", entry("piper", 3.0))  # 12,000 bytes > 10,000
    assert await cache.get("huge") is None and (await cache.snapshot()).skipped == 1


async def test_hits_return_the_same_samples_and_are_counted(tier: Tier) -> None:
    cache = await tier(10, 1 << 20, 1 << 20)
    stored = entry("piper", 1.0, rate=22050)
    await cache.put(key("one"), stored)
    found = await cache.get(key("one"))
    assert found is not None and found.sample_rate == 22050
    assert found.segment_chunks == stored.segment_chunks
    assert all(np.array_equal(a, b) for a, b in zip(found.chunks, stored.chunks, strict=True))
    assert await cache.get(key("two")) is None
    figures = await cache.snapshot()
    assert (figures.hits, figures.misses) == (1, 1)


async def test_disabled_cache_keeps_nothing(tier: Tier) -> None:
    cache = await tier(0, 1 << 20, 1 << 20)
    assert not await cache.put("a", entry("piper", 1.0))
    assert await cache.get("a") is None and (await cache.snapshot()).misses == 0


async def test_clear_model_drops_only_that_model(tier: Tier) -> None:
    cache = await tier(10, 1 << 20, 1 << 20)
    await cache.put(key("one"), entry("piper", 1.0))
    await cache.put(key("two"), entry("piper", 1.0))
    await cache.put(key("one", model="kokoro"), entry("kokoro", 1.0))
    assert await cache.clear_model("piper") == 2
    assert (await cache.snapshot()).items == 1
    assert await cache.get(key("one", model="kokoro")) is not None


async def test_an_entry_redis_evicted_leaves_the_budget(redis_url: str) -> None:
    """Redis's own maxmemory eviction (the guard behind the budgets) may drop an entry: the next
    lookup is a miss and the entry's bytes leave the running total."""
    cache = RedisCache(redis_url, 10, 1 << 20, 1 << 20, prefix="evicted:")
    await cache.put("a", entry("piper", 1.0))
    await cache.put("b", entry("piper", 1.0))
    with redis.Redis.from_url(redis_url) as client:
        client.delete("evicted:audio:a")  # as an allkeys-lru eviction would
    assert await cache.get("a") is None
    figures = await cache.snapshot()
    assert figures.items == 1 and figures.bytes == entry("piper", 1.0).nbytes
    await cache.close()


async def test_a_foreign_value_under_a_key_is_a_miss(redis_url: str) -> None:
    cache = RedisCache(redis_url, 10, 1 << 20, 1 << 20, prefix="foreign:")
    await cache.put("a", entry("piper", 1.0))
    with redis.Redis.from_url(redis_url) as client:
        client.set("foreign:audio:a", b"\x00\x00\x00\x05junk")
    assert await cache.get("a") is None and (await cache.snapshot()).errors == 1
    await cache.close()


async def test_redis_out_of_reach_is_a_miss_not_a_failure() -> None:
    cache = RedisCache(f"redis://127.0.0.1:{free_port()}/0", 10, 1 << 20, 1 << 20, timeout=0.5)
    assert await cache.get("a") is None
    assert not await cache.put("a", entry("piper", 1.0))
    assert (await cache.snapshot()).errors == 3  # lookup, store, figures
    await cache.close()


def test_entries_are_read_only() -> None:
    stored = entry("piper", 1.0)
    with pytest.raises(ValueError):
        stored.chunks[0][0] = 1.0


@pytest.fixture
def engine_calls(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Counts every synthesis call that reaches the piper engine."""
    engine: Engine = server.app.state.service.registry["piper"].engine
    calls: list[str] = []

    def counting(name: str) -> Callable[..., Any]:
        original = getattr(engine, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return original(*args, **kwargs)

        return wrapper

    for name in ("stream", "synthesize"):
        monkeypatch.setattr(engine, name, counting(name))
    yield calls


def fresh_text() -> str:
    return f"Cache check number {random.randrange(10**6)}. The second sentence follows here."


def test_repeat_is_a_hit_with_identical_bytes_and_no_engine_call(
    server: LiveServer, engine_calls: list[str]
) -> None:
    body = {"model": "piper", "voice": "alloy", "input": fresh_text(), "response_format": "mp3"}
    with server.client() as http:
        first = http.post("/v1/audio/speech", json=body)
        calls_after_miss = len(engine_calls)
        second = http.post("/v1/audio/speech", json=body)
        as_wav = http.post("/v1/audio/speech", json=body | {"response_format": "wav"})
        sse = http.post("/v1/audio/speech", json=body | {"stream_format": "sse"})
    assert first.headers["x-voxmux-cache"] == "miss" and calls_after_miss >= 2
    assert second.status_code == 200 and second.headers["x-voxmux-cache"] == "hit"
    assert second.content == first.content
    assert as_wav.headers["x-voxmux-cache"] == "hit"
    assert abs(decode(as_wav.content, "wav").duration - decode(first.content, "mp3").duration) < 0.1
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert sse.headers["x-voxmux-cache"] == "hit" and events[-1]["stats"]["cache"] == "hit"
    assert streamed == first.content
    assert len(engine_calls) == calls_after_miss


def test_a_websocket_request_is_served_from_the_cache(
    server: LiveServer, engine_calls: list[str]
) -> None:
    text = fresh_text()
    with server.client() as http:
        wav = http.post("/v1/audio/speech", json={  # the engine's rate, as on the socket
            "model": "piper", "voice": "alloy", "input": text, "response_format": "wav"}).content
    pcm = wav[44:]  # after the streaming WAV header
    calls_after_miss = len(engine_calls)
    audio = b""
    with connect(server.url.replace("http", "ws") + "/ws/v1/tts") as ws:
        ws.send(json.dumps({"model": "piper", "voice": "alloy", "input": text}))
        for message in ws:
            if isinstance(message, bytes):
                audio += message
                continue
            frame = json.loads(message)
            if frame["type"] in ("done", "error", "cancelled"):
                break
    assert frame["type"] == "done" and frame["stats"]["cache"] == "hit", frame
    assert audio == pcm
    assert len(engine_calls) == calls_after_miss


def test_invalidating_a_model_makes_the_next_request_a_miss(
    server: LiveServer, engine_calls: list[str]
) -> None:
    body = {"model": "piper", "voice": "alloy", "input": fresh_text(), "response_format": "pcm"}
    with server.client() as http:
        assert http.post("/v1/audio/speech", json=body).headers["x-voxmux-cache"] == "miss"
        assert http.post("/v1/audio/speech", json=body).headers["x-voxmux-cache"] == "hit"
        assert asyncio.run(server.app.state.service.invalidate_model("piper")) >= 1
        calls = len(engine_calls)
        again = http.post("/v1/audio/speech", json=body)
    assert again.headers["x-voxmux-cache"] == "miss" and len(engine_calls) > calls
