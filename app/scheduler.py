"""Per-model admission: a concurrency limit and a bounded FIFO queue in front of each engine."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from engines.base import Overloaded


@dataclass
class _Lane:
    slots: asyncio.Semaphore
    waiting: int = 0
    running: int = 0
    mean_seconds: float = 1.0


class Scheduler:
    def __init__(self, concurrency: int, queue_size: int) -> None:
        self.concurrency = concurrency
        self.queue_size = queue_size
        self._lanes: dict[str, _Lane] = {}

    def _lane(self, model_id: str) -> _Lane:
        lane = self._lanes.get(model_id)
        if lane is None:
            lane = self._lanes[model_id] = _Lane(asyncio.Semaphore(self.concurrency))
        return lane

    @property
    def queued(self) -> int:
        return sum(lane.waiting for lane in self._lanes.values())

    @property
    def active(self) -> int:
        return sum(lane.running for lane in self._lanes.values())

    def retry_after(self, model_id: str) -> int:
        lane = self._lane(model_id)
        return max(1, math.ceil(lane.mean_seconds * (lane.waiting + 1) / self.concurrency))

    @asynccontextmanager
    async def slot(self, model_id: str) -> AsyncIterator[None]:
        lane = self._lane(model_id)
        if lane.slots.locked() and lane.waiting >= self.queue_size:
            raise Overloaded(
                f"The '{model_id}' model is at capacity ({self.concurrency} running, "
                f"{lane.waiting} queued); retry later",
                retry_after=self.retry_after(model_id),
            )
        lane.waiting += 1
        try:
            await lane.slots.acquire()
        finally:
            lane.waiting -= 1
        lane.running += 1
        started = asyncio.get_running_loop().time()
        try:
            yield
        finally:
            lane.running -= 1
            lane.slots.release()
            elapsed = asyncio.get_running_loop().time() - started
            lane.mean_seconds = 0.8 * lane.mean_seconds + 0.2 * elapsed
