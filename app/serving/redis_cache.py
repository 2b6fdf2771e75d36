"""The shared cache tier: the audio cache in Redis, for every process and replica of a deployment.

Entries are keyed exactly as in the in-process cache (`cache_key`) and hold the same samples, so
a response cached by one ingress replica is a hit on any other, for any route and format. The
budgets are the in-process cache's, kept exactly: every entry's size and recency are indexed
next to it (a sorted set of keys by last use, a hash of sizes, a running byte total), and one Lua
script per operation reads, stores and evicts the least recently used entries atomically, so
concurrent replicas never overshoot `max_items` or `max_bytes`. Redis's own `maxmemory` with an
LRU policy is the guard behind that (see docs/scale-out.md): an entry it evicts is dropped from
the index the next time it is looked up, and an index key it evicts (the recency set, the sizes,
the total) is rebuilt from the rest by the next store, so the store never wedges on a stale
total.

An entry's value is a small JSON header (model, rate, chunk layout) followed by the raw float32
samples; nothing is unpickled from the shared store. Redis out of reach never fails a request:
the lookup is a miss, the store is skipped, and `errors` counts both.
"""

from __future__ import annotations

import json
import logging
import struct
from typing import Any

import numpy as np
import redis.asyncio as redis
from redis.exceptions import RedisError

from app.serving.cache import CachedAudio, CacheSnapshot
from engines.base import WordTiming

log = logging.getLogger(__name__)

PREFIX = "{voxmux}:cache:"
"""All keys share one hash tag, so the scripts work on a Redis Cluster too (one slot)."""

_GET = """
local value = redis.call('GET', KEYS[1])
if not value then
  local size = redis.call('HGET', KEYS[3], ARGV[1])
  if size then
    redis.call('HDEL', KEYS[3], ARGV[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    redis.call('HINCRBY', KEYS[4], 'bytes', -tonumber(size))
  end
  redis.call('HINCRBY', KEYS[4], 'misses', 1)
  return false
end
redis.call('ZADD', KEYS[2], redis.call('HINCRBY', KEYS[4], 'tick', 1), ARGV[1])
redis.call('HINCRBY', KEYS[4], 'hits', 1)
return value
"""

_PUT = """
local key, size = ARGV[1], tonumber(ARGV[3])
local max_items, max_bytes, prefix = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local audio = prefix .. 'audio:'

-- The index (KEYS[2] recency, KEYS[3] sizes, KEYS[4] the byte total and tick) made consistent
-- again from what is left of it: any of its keys may have been evicted (allkeys-lru). Entries
-- whose sizes are known are indexed (a lost recency as the oldest), an indexed entry without a
-- size gets its stored length, an entry that is gone leaves the index; the total is recounted.
local function rebuild()
  local total, indexed = 0, {}
  for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
    local known = redis.call('HGET', KEYS[3], member)
    if not known and redis.call('EXISTS', audio .. member) == 1 then
      known = redis.call('STRLEN', audio .. member)
      redis.call('HSET', KEYS[3], member, known)
    end
    if known then
      indexed[member] = true
      total = total + tonumber(known)
    else
      redis.call('ZREM', KEYS[2], member)
    end
  end
  local sizes = redis.call('HGETALL', KEYS[3])
  for i = 1, #sizes, 2 do
    local member = sizes[i]
    if not indexed[member] then
      if redis.call('EXISTS', audio .. member) == 1 then
        redis.call('ZADD', KEYS[2], 0, member)
        total = total + tonumber(sizes[i + 1])
      else
        redis.call('HDEL', KEYS[3], member)
      end
    end
  end
  local newest = redis.call('ZREVRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]
  if newest and tonumber(newest) > tonumber(redis.call('HGET', KEYS[4], 'tick') or 0) then
    redis.call('HSET', KEYS[4], 'tick', newest)
  end
  redis.call('HSET', KEYS[4], 'bytes', total)
  return total
end

local intact = redis.call('EXISTS', KEYS[2]) == 1 and redis.call('EXISTS', KEYS[3]) == 1
  and redis.call('HEXISTS', KEYS[4], 'bytes') == 1
local old = redis.call('HGET', KEYS[3], key)
if old then redis.call('HINCRBY', KEYS[4], 'bytes', -tonumber(old)) end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[3], key, size)
local total = redis.call('HINCRBY', KEYS[4], 'bytes', size)
redis.call('ZADD', KEYS[2], redis.call('HINCRBY', KEYS[4], 'tick', 1), key)
local rebuilt = not intact
if rebuilt then total = rebuild() end
local evicted = 0
while redis.call('ZCARD', KEYS[2]) > max_items or total > max_bytes do
  local victim = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not victim then  -- nothing indexed is over no budget: the total was stale
    total = rebuild()
    break
  end
  local victim_size = redis.call('HGET', KEYS[3], victim)
  if not rebuilt and (victim == key or not victim_size) then
    -- over budget with only this entry left, or an entry of unknown size: the index was
    -- partly lost; rebuilt once, then evicting goes on from a true total
    total = rebuild()
    rebuilt = true
  else
    redis.call('ZREM', KEYS[2], victim)
    redis.call('HDEL', KEYS[3], victim)
    redis.call('DEL', audio .. victim)
    if victim_size then total = redis.call('HINCRBY', KEYS[4], 'bytes', -tonumber(victim_size)) end
    evicted = evicted + 1
  end
end
return evicted
"""

_CLEAR_MODEL = """
local dropped = 0
for _, key in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(key, 1, #ARGV[1]) == ARGV[1] then
    local size = redis.call('HGET', KEYS[2], key)
    redis.call('ZREM', KEYS[1], key)
    redis.call('HDEL', KEYS[2], key)
    redis.call('DEL', ARGV[2] .. 'audio:' .. key)
    if size then redis.call('HINCRBY', KEYS[3], 'bytes', -tonumber(size)) end
    dropped = dropped + 1
  end
end
return dropped
"""


def encode_entry(entry: CachedAudio) -> bytes:
    header = json.dumps({
        "model_id": entry.model_id,
        "sample_rate": entry.sample_rate,
        "segment_chunks": list(entry.segment_chunks),
        "lengths": [len(chunk) for chunk in entry.chunks],
        "words": None if entry.words is None else [
            [[w.word, w.start, w.end, w.char_start, w.char_end, list(w.char_times)]
             for w in segment]
            for segment in entry.words
        ],
        "texts": list(entry.texts),
    }).encode()
    samples = b"".join(np.asarray(c, dtype="<f4").tobytes() for c in entry.chunks)
    return struct.pack(">I", len(header)) + header + samples


def decode_entry(blob: bytes) -> CachedAudio:
    (size,) = struct.unpack_from(">I", blob)
    header = json.loads(blob[4:4 + size])
    offset, chunks = 4 + size, []
    for length in header["lengths"]:
        chunk = np.frombuffer(blob, dtype="<f4", count=length, offset=offset)  # read-only
        chunks.append(chunk.astype(np.float32, copy=False))
        offset += length * 4
    words = header.get("words")
    return CachedAudio(
        header["model_id"], header["sample_rate"], tuple(chunks), tuple(header["segment_chunks"]),
        None if words is None else tuple(
            tuple(WordTiming(w, s, e, cs, ce, tuple(times)) for w, s, e, cs, ce, times in segment)
            for segment in words
        ),
        tuple(header.get("texts", ())),
    )


class RedisCache:
    """`AudioCache` in Redis at `url`; the same budgets and recency as `MemoryCache`."""

    def __init__(self, url: str, max_items: int, max_bytes: int, max_item_bytes: int, *,
                 prefix: str = PREFIX, timeout: float = 2.0) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_item_bytes = min(max_item_bytes, max_bytes)
        self.prefix = prefix
        self.errors = 0
        self.skipped = 0
        self._redis = redis.Redis.from_url(url, socket_timeout=timeout,
                                           socket_connect_timeout=timeout)
        self._get = self._redis.register_script(_GET)
        self._put = self._redis.register_script(_PUT)
        self._clear_model = self._redis.register_script(_CLEAR_MODEL)
        self._lru, self._sizes, self._meta = (f"{prefix}lru", f"{prefix}sizes", f"{prefix}meta")

    @property
    def enabled(self) -> bool:
        return self.max_items > 0 and self.max_bytes > 0

    def fits(self, nbytes: int) -> bool:
        return self.enabled and nbytes <= self.max_item_bytes

    def _keys(self, key: str) -> list[str]:
        return [f"{self.prefix}audio:{key}", self._lru, self._sizes, self._meta]

    def _failed(self, action: str, exc: Exception) -> None:
        self.errors += 1
        log.warning("cache: %s failed, served without the shared cache: %s", action, exc)

    async def get(self, key: str, *, timed: bool = False) -> CachedAudio | None:
        if not self.enabled:
            return None
        try:
            blob = await self._get(keys=self._keys(key), args=[key])
        except (RedisError, OSError) as exc:
            self._failed("lookup", exc)
            return None
        if not blob:
            return None
        try:
            entry = decode_entry(blob)
        except (ValueError, KeyError, TypeError, struct.error) as exc:  # not one of ours
            self._failed("decoding an entry", exc)
            return None
        return None if timed and entry.words is None else entry

    async def put(self, key: str, entry: CachedAudio) -> bool:
        if not self.fits(entry.nbytes):
            self.skipped += 1
            return False
        args: list[Any] = [key, encode_entry(entry), entry.nbytes, self.max_items,
                           self.max_bytes, self.prefix]
        try:
            await self._put(keys=self._keys(key), args=args)
        except (RedisError, OSError) as exc:
            self._failed("store", exc)
            return False
        return True

    async def clear_model(self, model_id: str) -> int:
        try:
            dropped = await self._clear_model(keys=[self._lru, self._sizes, self._meta],
                                              args=[f"{model_id}:", self.prefix])
        except (RedisError, OSError) as exc:
            self._failed("clearing a model", exc)
            return 0
        return int(dropped)

    async def snapshot(self) -> CacheSnapshot:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(self._meta)
                pipe.zcard(self._lru)
                meta, items = await pipe.execute()
        except (RedisError, OSError) as exc:
            self._failed("reading the cache's figures", exc)
            meta, items = {}, 0

        def count(name: str) -> int:
            return int(meta.get(name.encode(), 0))

        return CacheSnapshot(int(items), count("bytes"), count("hits"), count("misses"),
                             self.skipped, self.max_items, self.max_bytes, self.errors)

    async def clear(self) -> None:
        """Drop every entry and figure of this cache (tests, an operator's reset)."""
        keys = [k async for k in self._redis.scan_iter(match=f"{_glob(self.prefix)}*")]
        if keys:
            await self._redis.delete(*keys)

    async def close(self) -> None:
        await self._redis.aclose()


def _glob(text: str) -> str:
    """`text` with Redis glob characters escaped."""
    return "".join(f"\\{c}" if c in "*?[]\\{}" else c for c in text)
