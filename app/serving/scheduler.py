"""A model's lane: how requests reach its engine, shared out fairly between clients.

A request holds one of the model's *places* only while it has engine work to do: a text-in session
waiting for its next sentence, or a job waiting for a slow reader, holds none. A new request is
refused at once with `Overloaded` (429, with a `Retry-After` from how long recent requests took)
when `concurrency + queue_size` requests hold places, or when its client already holds
`client_places` of them. A request already under way is never refused: when it comes back with work
to a full lane, or over its client's share, it waits for a place, holding nothing, in arrival order
(its request timeout bounds the wait), so the bounds hold however many idle sessions a client opened
before it spoke. Each engine call then asks for one of the `concurrency` *turns*. A finished turn
goes to the waiting client that was served longest ago (a client never served first), to its oldest
waiter: one client's many requests cannot delay another client's first audio by more than the calls
already running, and nobody overtakes within a client. A turn's engine call runs on the lane's own
threads (one per turn) and holds the turn until the call has really returned, even when the request
was cancelled or timed out meanwhile: the cancel token stops the engine at its next step, and only
then is the turn handed on.

A `background` turn (a long-form job's segment, `app.jobs`) is handed out only when no other
request waits for one: an interactive request that arrives while a job renders waits for at most
the job's segment under way, however long the book.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

from app.serving import tracing
from engines.base import CancelToken, Overloaded, RequestTimeout

T = TypeVar("T")

Abandon = Callable[[BaseException], None]
"""Told why a call is being abandoned, before the lane waits for its thread to stop."""


@dataclass(eq=False)
class _Waiter:
    ticket: str
    client: str
    future: asyncio.Future[None]
    granted: bool = False


@dataclass(eq=False)
class _PlaceWaiter:
    ticket: str
    client: str
    future: asyncio.Future[None]


@dataclass(eq=False)
class _Place:
    client: str
    started: bool = False
    """Whether the request has had a turn since it took its place."""


@dataclass(frozen=True)
class LaneState:
    running: int
    """Requests holding a place that have had their turn."""
    queued: int
    """Requests holding a place, still waiting for their first turn."""
    in_flight: int
    """Engine calls running now (counted in the engine threads)."""


RECENT_CLIENTS = 1024
"""Clients whose last turn a lane remembers; one forgotten counts as never served."""


@dataclass
class _Round:
    """Waiters by client. The next turn goes to the waiting client served longest ago (one never
    served first, in arrival order), to its oldest waiter."""

    queues: dict[str, deque[_Waiter]] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    """Client -> when it last had a turn (a count of turns), least recent first."""
    ticks: int = 0

    def __bool__(self) -> bool:
        return bool(self.queues)

    def add(self, waiter: _Waiter) -> None:
        self.queues.setdefault(waiter.client, deque()).append(waiter)

    def remove(self, waiter: _Waiter) -> None:
        queue = self.queues.get(waiter.client)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self.queues[waiter.client]

    def pop(self) -> _Waiter | None:
        while self.queues:
            client = min(self.queues, key=lambda c: self.served.get(c, -1))
            queue = self.queues[client]
            waiter = queue.popleft()
            if not queue:
                del self.queues[client]
            if not waiter.future.done():
                self.serve(client)
                return waiter
        return None

    def serve(self, client: str) -> None:
        """Note that `client` has a turn now."""
        self.ticks += 1
        self.served.pop(client, None)
        self.served[client] = self.ticks
        if len(self.served) > RECENT_CLIENTS:
            del self.served[next(iter(self.served))]


class Lane:
    def __init__(self, model_id: str, concurrency: int, queue_size: int,
                 client_places: int | None = None) -> None:
        """`client_places`: the most places one client may take (None: all of them)."""
        self.model_id = model_id
        self.concurrency = concurrency
        self.queue_size = queue_size
        self.client_places = client_places or concurrency + queue_size
        self._executor = ThreadPoolExecutor(concurrency, thread_name_prefix=f"engine-{model_id}")
        self._turns = 0
        self._round = _Round()
        self._background: deque[_Waiter] = deque()
        """Background turns waiting; served only when `_round` has nobody."""
        self._places: dict[str, _Place] = {}
        """Ticket -> its place, in the order they were taken."""
        self._place_waiters: deque[_PlaceWaiter] = deque()
        """Requests under way waiting for a place; none of them has room (see `_hand_on`)."""
        self._mean_seconds = 1.0
        self._count_lock = threading.Lock()
        self._in_flight = 0
        self._calls: dict[object, float] = {}
        """Engine calls running now -> when each began (monotonic)."""

    # -- state -------------------------------------------------------------------------------

    def state(self) -> LaneState:
        started = sum(p.started for p in self._places.values())
        return LaneState(started, len(self._places) - started, self._in_flight)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def position(self, ticket: str) -> int | None:
        """1-based place among the requests still waiting for their first turn; None once it
        has started (or holds no place)."""
        waiting = [t for t, place in self._places.items() if not place.started]
        return waiting.index(ticket) + 1 if ticket in waiting else None

    def retry_after(self) -> int:
        """Seconds until a request holding a place is likely to have let it go."""
        return max(1, math.ceil(self._mean_seconds / max(1, len(self._places))))

    # -- places ------------------------------------------------------------------------------

    def admit(self, client: str) -> None:
        """Raise `Overloaded` unless a new request of `client` may start now; takes nothing."""
        held = len(self._places)
        if held >= self.concurrency + self.queue_size:
            raise Overloaded(
                f"The '{self.model_id}' model is at capacity ({held} requests in progress); "
                "retry later",
                retry_after=self.retry_after(),
            )
        own = self._held_by(client)
        if own >= self.client_places:
            raise Overloaded(
                f"This client already has {own} requests in progress on the '{self.model_id}' "
                "model, its share; retry when one has finished",
                retry_after=self.retry_after(),
            )

    def _held_by(self, client: str) -> int:
        return sum(p.client == client for p in self._places.values())

    def _room_for(self, client: str) -> bool:
        return (len(self._places) < self.concurrency + self.queue_size
                and self._held_by(client) < self.client_places)

    @asynccontextmanager
    async def place(self, ticket: str, client: str, timeout: float | None = None
                    ) -> AsyncIterator[None]:
        """Hold a place while a request has engine work. A new request takes it at once (its
        `admit` just passed); one under way waits for room, at most `timeout` s."""
        if self._room_for(client):
            self._places[ticket] = _Place(client)
        else:
            await self._wait_for_place(_PlaceWaiter(
                ticket, client, asyncio.get_running_loop().create_future()), timeout)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            yield
        finally:
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (loop.time() - started)
            del self._places[ticket]
            self._hand_on()

    async def _wait_for_place(self, waiter: _PlaceWaiter, timeout: float | None) -> None:
        self._place_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter.future
        except BaseException as exc:
            if waiter.ticket in self._places:  # the place came as we gave up: pass it on
                del self._places[waiter.ticket]
                self._hand_on()
            elif waiter in self._place_waiters:
                self._place_waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise RequestTimeout(
                    f"The request waited {timeout:g} s for a place on the '{self.model_id}' "
                    "model"
                ) from None
            raise

    def _hand_on(self) -> None:
        """Give freed places to the waiters that now have room, oldest first: afterwards no
        waiter has room, so a request that finds room may take it."""
        for waiter in list(self._place_waiters):
            if waiter.future.done():
                self._place_waiters.remove(waiter)
            elif self._room_for(waiter.client):
                self._place_waiters.remove(waiter)
                self._places[waiter.ticket] = _Place(waiter.client)
                waiter.future.set_result(None)

    # -- turns -------------------------------------------------------------------------------

    @asynccontextmanager
    async def turn(self, ticket: str, timeout: float | None, client: str = "",
                   background: bool = False) -> AsyncIterator[Turn]:
        """Hold one of the `concurrency` turns; waits its client's turn, at most `timeout` s.
        A `background` turn waits until no other request waits."""
        with tracing.span("lane wait", {"voxmux.model": self.model_id}):
            idle = not self._round and not (background and self._background)
            if self._turns < self.concurrency and idle:
                self._turns += 1
                self._round.serve(client)
            else:
                waiter = _Waiter(ticket, client, asyncio.get_running_loop().create_future())
                await self._wait(waiter, timeout, background)
        if ticket in self._places:
            self._places[ticket].started = True
        turn = Turn(self)
        try:
            yield turn
        finally:
            try:
                await turn.stopped()
            finally:
                self._release()

    async def _wait(self, waiter: _Waiter, timeout: float | None, background: bool = False
                    ) -> None:
        if background:
            self._background.append(waiter)
        else:
            self._round.add(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter.future
        except BaseException as exc:
            if waiter.granted:  # the turn arrived as we gave up: pass it on
                self._release()
            elif background:  # (already dropped if its future was cancelled before its turn)
                with contextlib.suppress(ValueError):
                    self._background.remove(waiter)
            else:
                self._round.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise RequestTimeout(
                    f"The request waited {timeout:g} s for the '{self.model_id}' engine"
                ) from None
            raise

    def _release(self) -> None:
        waiter = self._round.pop() or self._next_background()
        if waiter is None:
            self._turns -= 1
            return
        waiter.granted = True
        waiter.future.set_result(None)

    def _next_background(self) -> _Waiter | None:
        while self._background:
            waiter = self._background.popleft()
            if not waiter.future.done():
                self._round.serve(waiter.client)
                return waiter
        return None

    def _counted(self, fn: Callable[[], T]) -> T:
        call = object()
        with self._count_lock:
            self._in_flight += 1
            self._calls[call] = time.monotonic()
        try:
            return fn()
        finally:
            with self._count_lock:
                self._in_flight -= 1
                del self._calls[call]

    def longest_call(self) -> float:
        """Seconds the longest-running engine call has run so far (0: none runs)."""
        with self._count_lock:
            oldest = min(self._calls.values(), default=None)
        return 0.0 if oldest is None else time.monotonic() - oldest

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
