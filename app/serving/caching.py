"""A job's use of the audio cache: look its render record up, keep what it renders, store it.

What is kept is bounded by the cache's largest entry: past it the copy is dropped at once, never
held to the end. A result is stored only when the job rendered every segment and the model still
renders the voice as it did when the job was planned (`RenderRecord.current`): a rescan or a
reload that changed the voice while the job ran means its audio belongs to neither version.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.serving.assembly import Joined
from app.serving.cache import AudioCache, CachedAudio
from app.serving.plan import Speaker
from app.serving.record import RenderRecord
from engines.base import Engine


class CacheStep:
    def __init__(self, cache: AudioCache, record: RenderRecord, *, timed: bool) -> None:
        """`timed`: the request wants word timings, so only an entry that kept them is a hit,
        and what is stored keeps them."""
        self._cache = cache
        self.record = record
        self.key = record.key()
        self._timed = timed
        self._kept: list[Joined] | None = []
        self._size = 0

    async def lookup(self) -> CachedAudio | None:
        return await self._cache.get(self.key, timed=self._timed)

    def keep(self, joined: Joined) -> None:
        if self._kept is None:
            return
        self._size += sum(chunk.nbytes for chunk in joined.chunks)
        if self._cache.fits(self._size):
            self._kept.append(joined)
        else:
            self._kept = None  # too big to cache: no second copy held

    async def store(self, engine: Engine, sample_rate: int,
                    speakers: Mapping[int, Speaker] | None = None) -> bool:
        """Store what was kept, unless the engines (`engine`, those of SSML's `speakers`) no
        longer render it as they did when the record was made."""
        kept = self._kept
        if kept is None or not self.record.current(engine, speakers):
            return False
        timed = ([j.words for j in kept], [j.text for j in kept]) if self._timed else None
        entry = CachedAudio.build(self.record.model, sample_rate, [j.chunks for j in kept], timed)
        return await self._cache.put(self.key, entry)
