"""A model's lane: how requests reach its engine.

Admission bounds how many requests a model takes on (`concurrency + queue_size`); one more is
refused at once with `Overloaded` (429) and a `Retry-After` from how long recent requests took.
An admitted request then asks for a turn for each of its segments: at most `concurrency` turns
run at once, and a finished turn goes straight to the oldest waiter, so concurrent requests take
segment-sized turns in arrival order and nobody overtakes. A turn's engine call runs on the
lane's own threads (one per turn) and holds the turn until the call has really returned, even
when the request was cancelled or timed out meanwhile: the cancel token stops the engine at its
next step, and only then is the turn handed on.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from engines.base import CancelToken, Overloaded, RequestTimeout

T = TypeVar("T")

Abandon = Callable[[BaseException], None]
"""Told why a call is being abandoned, before the lane waits for its thread to stop."""


@dataclass(eq=False)
class _Waiter:
    ticket: str
    future: asyncio.Future[None]
    granted: bool = False


@dataclass(frozen=True)
class LaneState:
    running: int
    """Admitted requests that have had their first turn."""
    queued: int
    """Admitted requests still waiting for their first turn."""
    in_flight: int
    """Engine calls running now (counted in the engine threads)."""


class Lane:
    def __init__(self, model_id: str, concurrency: int, queue_size: int) -> None:
        self.model_id = model_id
        self.concurrency = concurrency
        self.queue_size = queue_size
        self._executor = ThreadPoolExecutor(concurrency, thread_name_prefix=f"engine-{model_id}")
        self._turns = 0
        self._waiters: deque[_Waiter] = deque()
        self._admitted: dict[str, bool] = {}
        """Ticket -> whether it has had a turn yet, in admission order."""
        self._mean_seconds = 1.0
        self._count_lock = threading.Lock()
        self._in_flight = 0

    # -- state -------------------------------------------------------------------------------

    def state(self) -> LaneState:
        started = sum(self._admitted.values())
        return LaneState(started, len(self._admitted) - started, self._in_flight)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def position(self, ticket: str) -> int | None:
        """1-based place among the requests still waiting for their first turn; None once it
        has started (or was never admitted)."""
        waiting = [t for t, started in self._admitted.items() if not started]
        return waiting.index(ticket) + 1 if ticket in waiting else None

    def retry_after(self) -> int:
        """Seconds until an admitted request is likely to have left."""
        return max(1, math.ceil(self._mean_seconds / max(1, len(self._admitted))))

    # -- admission and turns -----------------------------------------------------------------

    @asynccontextmanager
    async def admitted(self, ticket: str) -> AsyncIterator[None]:
        """Take one of the model's request places for the whole request, or raise Overloaded."""
        if len(self._admitted) >= self.concurrency + self.queue_size:
            raise Overloaded(
                f"The '{self.model_id}' model is at capacity ({len(self._admitted)} requests "
                "admitted); retry later",
                retry_after=self.retry_after(),
            )
        self._admitted[ticket] = False
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            yield
        finally:
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (loop.time() - started)
            del self._admitted[ticket]

    @asynccontextmanager
    async def turn(self, ticket: str, timeout: float | None) -> AsyncIterator[Turn]:
        """Hold one of the `concurrency` turns; waits in FIFO order, at most `timeout` s."""
        if self._turns < self.concurrency and not self._waiters:
            self._turns += 1
        else:
            await self._wait(ticket, timeout)
        if ticket in self._admitted:
            self._admitted[ticket] = True
        turn = Turn(self)
        try:
            yield turn
        finally:
            try:
                await turn.stopped()
            finally:
                self._release()

    async def _wait(self, ticket: str, timeout: float | None) -> None:
        waiter = _Waiter(ticket, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter.future
        except BaseException as exc:
            if waiter.granted:  # the turn arrived as we gave up: pass it on
                self._release()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise RequestTimeout(
                    f"The request waited {timeout:g} s for the '{self.model_id}' engine"
                ) from None
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.granted = True
                waiter.future.set_result(None)
                return
        self._turns -= 1

    def _counted(self, fn: Callable[[], T]) -> T:
        with self._count_lock:
            self._in_flight += 1
        try:
            return fn()
        finally:
            with self._count_lock:
                self._in_flight -= 1

    def close(self) -> None:
        """At shutdown: no new engine calls; one still running finishes in its thread."""
        self._executor.shutdown(wait=False, cancel_futures=True)


class Turn:
    """One granted turn: runs engine calls on the lane's threads."""

    def __init__(self, lane: Lane) -> None:
        self._lane = lane
        self._future: asyncio.Future[object] | None = None

    async def call(self, fn: Callable[[], T], cancel: CancelToken, timeout: float | None,
                   abandon: Abandon | None = None) -> T:
        """`fn()` on an engine thread. A timeout or a cancellation sets `cancel` (the engine
        stops at its next step), tells `abandon` why, and waits for the thread to return before
        raising: the turn is never handed on while its engine call still runs."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._lane._executor, self._lane._counted, fn)
        self._future = future  # type: ignore[assignment]
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(future)
        except TimeoutError:
            error: BaseException = RequestTimeout(
                f"The '{self._lane.model_id}' engine made no progress for {timeout:g} s"
            )
        except asyncio.CancelledError as exc:
            error = exc
        cancel.cancel()
        if abandon is not None:
            abandon(error)
        await self.stopped()
        raise error

    async def stopped(self) -> None:
        """Wait, whatever cancels us meanwhile, until the last engine call has returned."""
        future = self._future
        if future is None:
            return
        cancelled = False
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                cancelled = True
            except Exception:
                break
        if not future.cancelled():
            future.exception()  # retrieved: a failure after abandoning is not "never retrieved"
        if cancelled:
            raise asyncio.CancelledError
