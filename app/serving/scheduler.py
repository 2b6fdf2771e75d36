"""Per-model admission: a concurrency limit and a bounded FIFO queue in front of each engine.

A finished request hands its slot straight to the oldest waiter, so nobody overtakes the queue.
Beyond `queue_size` waiters a request is refused at once with `Overloaded` (429) and a
`Retry-After` estimated from how long recent requests held their slots.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from engines.base import Overloaded, RequestTimeout


@dataclass(eq=False)
class _Waiter:
    ticket: str
    future: asyncio.Future[None]
    granted: bool = False


@dataclass(eq=False)
class _Lane:
    running: int = 0
    waiters: deque[_Waiter] = field(default_factory=deque)
    mean_seconds: float = 1.0


@dataclass(frozen=True)
class LaneState:
    running: int
    queued: int


class Scheduler:
    def __init__(self, concurrency: int, queue_size: int) -> None:
        self.concurrency = concurrency
        self.queue_size = queue_size
        self._lanes: dict[str, _Lane] = {}

    def _lane(self, model_id: str) -> _Lane:
        lane = self._lanes.get(model_id)
        if lane is None:
            lane = self._lanes[model_id] = _Lane()
        return lane

    @property
    def queued(self) -> int:
        return sum(len(lane.waiters) for lane in self._lanes.values())

    @property
    def active(self) -> int:
        return sum(lane.running for lane in self._lanes.values())

    def lanes(self) -> dict[str, LaneState]:
        return {m: LaneState(lane.running, len(lane.waiters)) for m, lane in self._lanes.items()}

    def position(self, model_id: str, ticket: str) -> int | None:
        """1-based place of `ticket` in the model's queue; None once it runs (or never queued)."""
        lane = self._lanes.get(model_id)
        if lane is None:
            return None
        for place, waiter in enumerate(lane.waiters, start=1):
            if waiter.ticket == ticket:
                return place
        return None

    def retry_after(self, model_id: str) -> int:
        lane = self._lane(model_id)
        ahead = len(lane.waiters) + lane.running
        return max(1, math.ceil(lane.mean_seconds * ahead / self.concurrency))

    @asynccontextmanager
    async def slot(
        self, model_id: str, ticket: str = "", timeout: float | None = None
    ) -> AsyncIterator[None]:
        """Hold one of the model's slots; waits in FIFO order, at most `timeout` seconds."""
        lane = self._lane(model_id)
        if lane.running < self.concurrency and not lane.waiters:
            lane.running += 1
        else:
            await self._wait(model_id, lane, ticket, timeout)
        started = asyncio.get_running_loop().time()
        try:
            yield
        finally:
            elapsed = asyncio.get_running_loop().time() - started
            lane.mean_seconds = 0.8 * lane.mean_seconds + 0.2 * elapsed
            self._release(lane)

    async def _wait(self, model_id: str, lane: _Lane, ticket: str, timeout: float | None
                    ) -> None:
        if len(lane.waiters) >= self.queue_size:
            raise Overloaded(
                f"The '{model_id}' model is at capacity ({lane.running} running, "
                f"{len(lane.waiters)} queued); retry later",
                retry_after=self.retry_after(model_id),
            )
        waiter = _Waiter(ticket, asyncio.get_running_loop().create_future())
        lane.waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter.future
        except BaseException as exc:
            if waiter.granted:  # the slot arrived as we were cancelled: pass it on
                self._release(lane)
            elif waiter in lane.waiters:
                lane.waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise RequestTimeout(
                    f"The request waited {timeout:g} s in the '{model_id}' queue"
                ) from None
            raise

    def _release(self, lane: _Lane) -> None:
        while lane.waiters:
            waiter = lane.waiters.popleft()
            if not waiter.future.done():
                waiter.granted = True
                waiter.future.set_result(None)
                return
        lane.running -= 1
