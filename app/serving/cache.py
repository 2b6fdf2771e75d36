"""The audio cache: synthesized audio by canonical request, bounded by an item count and a byte
budget, least recently used first out.

An entry holds the float32 chunks a request produced (after trimming, stretching and pauses), not
encoded bytes: one entry serves every response format and every route, and because encoders are
deterministic a hit yields the same bytes a miss did. The key is a hash of the request's render
record (`app.serving.record`): everything that shapes its audio, a fingerprint of the voice's
files among it, and it starts with the model id so a model's entries can be dropped together.

`AudioCache` is the interface a job uses, asynchronous so that a shared tier can sit behind it:
`MemoryCache` (the default, in this process; its coroutines never wait, so a lookup costs no more
than a dictionary read) and `RedisCache` (`app.serving.redis_cache`, `VOXMUX_CACHE_URL`), which
every process and replica of a deployment shares. A cache never fails a request: a tier that
cannot be reached counts as a miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from cachetools import LRUCache

from engines.base import Audio, WordTiming


@dataclass(frozen=True)
class CachedAudio:
    model_id: str
    sample_rate: int
    chunks: tuple[Audio, ...]
    segment_chunks: tuple[int, ...]
    """How many of `chunks` each text segment produced, in order."""
    words: tuple[tuple[WordTiming, ...], ...] | None = None
    """Each segment's word timings (spans in its text), when the request asked for them."""
    texts: tuple[str, ...] = ()
    """The segments the words were timed on: a hit may differ from them in whitespace only."""

    def segment_words(self, index: int, text: str) -> tuple[WordTiming, ...]:
        """Segment `index`'s words, their spans moved onto `text` (the same words, perhaps
        spaced differently: the key ignores whitespace)."""
        words = self.words[index] if self.words is not None else ()
        stored = self.texts[index] if index < len(self.texts) else text
        if stored == text:
            return words
        mapping = _respace(stored, text)
        moved = []
        for w in words:
            start = mapping[w.char_start]
            end = mapping[w.char_end - 1] + 1 if w.char_end > w.char_start else start
            moved.append(WordTiming(text[start:end], w.start, w.end, start, end, w.char_times))
        return tuple(moved)

    @property
    def nbytes(self) -> int:
        return sum(chunk.nbytes for chunk in self.chunks)

    @property
    def samples(self) -> int:
        return sum(len(chunk) for chunk in self.chunks)

    @classmethod
    def build(cls, model_id: str, sample_rate: int, segments: Sequence[Sequence[Audio]],
              timed: tuple[Sequence[tuple[WordTiming, ...]], Sequence[str]] | None = None
              ) -> CachedAudio:
        """`timed`: each segment's words (spans in its text) and the segments' texts."""
        chunks = []
        for segment in segments:
            for chunk in segment:
                frozen = np.array(chunk, dtype=np.float32, copy=True)
                frozen.flags.writeable = False
                chunks.append(frozen)
        words, texts = (tuple(timed[0]), tuple(timed[1])) if timed else (None, ())
        return cls(model_id, sample_rate, tuple(chunks), tuple(len(s) for s in segments),
                   words, texts)


def _respace(stored: str, text: str) -> list[int]:
    """For each position in `stored`, the same position in `text`, which has the same
    non-space characters with other whitespace."""
    solid = [i for i, c in enumerate(text) if not c.isspace()]
    mapping: list[int] = []
    seen = 0
    for c in stored:
        mapping.append(solid[seen] if seen < len(solid) else len(text))
        if not c.isspace():
            seen += 1
    mapping.append(len(text))
    return mapping


@dataclass(frozen=True)
class CacheSnapshot:
    items: int
    bytes: int
    hits: int
    misses: int
    skipped: int
    """Entries refused for being over `max_item_bytes`."""
    max_items: int
    max_bytes: int
    errors: int = 0
    """Lookups and stores that failed (a shared tier out of reach); each counted as a miss."""


class AudioCache(Protocol):
    max_item_bytes: int

    @property
    def enabled(self) -> bool: ...

    def fits(self, nbytes: int) -> bool:
        """Whether an entry of `nbytes` would be kept (a job stops collecting beyond it)."""

    async def get(self, key: str, *, timed: bool = False) -> CachedAudio | None:
        """The entry for `key`; with `timed`, only one that kept its word timings (another is
        a miss: the request is synthesized again, with timings, and stored in its place)."""

    async def put(self, key: str, entry: CachedAudio) -> bool: ...

    async def clear_model(self, model_id: str) -> int:
        """Drop every entry of one model (its voices or weights changed); returns how many."""

    async def snapshot(self) -> CacheSnapshot: ...

    async def close(self) -> None: ...


def _size(entry: CachedAudio) -> int:
    return entry.nbytes


class MemoryCache:
    """The in-process tier (cachetools). Not thread-safe: used from the event loop only."""

    def __init__(self, max_items: int, max_bytes: int, max_item_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_item_bytes = min(max_item_bytes, max_bytes)
        self._lru: LRUCache[str, CachedAudio] = LRUCache(max(max_bytes, 1), getsizeof=_size)
        self.hits = 0
        self.misses = 0
        self.skipped = 0
        """Entries refused for being over `max_item_bytes`."""

    @property
    def enabled(self) -> bool:
        return self.max_items > 0 and self.max_bytes > 0

    @property
    def items(self) -> int:
        return len(self._lru)

    @property
    def bytes(self) -> int:
        return int(self._lru.currsize)

    async def get(self, key: str, *, timed: bool = False) -> CachedAudio | None:
        if not self.enabled:
            return None
        entry = self._lru.get(key)
        if entry is not None and timed and entry.words is None:
            entry = None  # synthesized again, with timings, and stored in its place
        if entry is None:
            self.misses += 1
        else:
            self.hits += 1
        return entry

    def fits(self, nbytes: int) -> bool:
        return self.enabled and nbytes <= self.max_item_bytes

    async def put(self, key: str, entry: CachedAudio) -> bool:
        if not self.fits(entry.nbytes):
            self.skipped += 1
            return False
        self._lru[key] = entry  # evicts least recently used entries to fit the byte budget
        while len(self._lru) > self.max_items:
            self._lru.popitem()
        return True

    async def clear_model(self, model_id: str) -> int:
        # Keys start with the model id, so the recency of the other entries stays untouched.
        stale = [key for key in list(self._lru) if key.rpartition(":")[0] == model_id]
        for key in stale:
            del self._lru[key]
        return len(stale)

    def clear(self) -> None:
        self._lru.clear()

    async def snapshot(self) -> CacheSnapshot:
        return CacheSnapshot(self.items, self.bytes, self.hits, self.misses, self.skipped,
                             self.max_items, self.max_bytes)

    async def close(self) -> None:
        return None


def open_cache(url: str | None, max_items: int, max_bytes: int, max_item_bytes: int
               ) -> AudioCache:
    """The tier `url` names (`redis://...`), or the in-process one when it is empty."""
    if not url:
        return MemoryCache(max_items, max_bytes, max_item_bytes)
    from app.serving.redis_cache import RedisCache  # the optional redis client, only when asked

    return RedisCache(url, max_items, max_bytes, max_item_bytes)
