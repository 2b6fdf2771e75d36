"""The board deployment: what every replica needs to know of the others.

- Engine replicas report their `ReplicaState` when something changes and at least every
  `REPORT_SECONDS`; the status routes read them. A replica that stops reporting (it died, or was
  scaled down without saying goodbye) leaves the board after `STALE_SECONDS`.
- Ingress replicas register the request ids of the jobs they run. A cancel by id
  (`POST /v1/audio/requests/{id}/cancel`) reaches whichever ingress replica Serve's proxy picks;
  it cancels its own jobs and asks the board, which wakes the other replicas running that id
  (each waits on `cancels()`, a long poll) and says how many requests there were.

Every method is a coroutine, so all of it runs on the replica's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict

from app.cluster.engines import REPORT_SECONDS
from app.serving.fleet import ReplicaState

STALE_SECONDS = 5 * REPORT_SECONDS


class Board:
    def __init__(self) -> None:
        self._states: dict[str, ReplicaState] = {}
        self._seen: dict[str, float] = {}
        self._running: defaultdict[str, Counter[str]] = defaultdict(Counter)
        """Request id -> ingress replica -> jobs carrying it (opened minus closed)."""
        self._pending: defaultdict[str, set[str]] = defaultdict(set)
        """Ingress replica -> request ids it must cancel."""
        self._wake: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    # -- engine replicas ---------------------------------------------------------------------

    async def report(self, state: ReplicaState) -> None:
        self._states[state.id] = state
        self._seen[state.id] = time.monotonic()

    async def forget(self, replica: str) -> None:
        self._states.pop(replica, None)
        self._seen.pop(replica, None)

    async def replicas(self) -> list[ReplicaState]:
        now = time.monotonic()
        for replica, seen in list(self._seen.items()):
            if now - seen > STALE_SECONDS:
                await self.forget(replica)
        return sorted(self._states.values(), key=lambda s: s.id)

    # -- ingress replicas --------------------------------------------------------------------

    async def opened(self, ingress: str, request_id: str) -> None:
        self._count(request_id, ingress, 1)

    async def closed(self, ingress: str, request_id: str) -> None:
        self._count(request_id, ingress, -1)  # may arrive first: the counts still add up

    def _count(self, request_id: str, ingress: str, step: int) -> None:
        holders = self._running[request_id]
        holders[ingress] += step
        if holders[ingress] == 0:
            del holders[ingress]
        if not holders:
            del self._running[request_id]

    async def cancel(self, request_id: str, origin: str) -> int:
        """Tell every ingress replica but `origin` to cancel `request_id`; how many requests
        they run with it."""
        count = 0
        for ingress, jobs in self._running.get(request_id, Counter()).items():
            if ingress != origin and jobs > 0:
                self._pending[ingress].add(request_id)
                self._wake[ingress].set()
                count += jobs
        return count

    async def cancels(self, ingress: str, wait: float) -> list[str]:
        """Request ids `ingress` must cancel; waits up to `wait` seconds for one."""
        wake = self._wake[ingress]
        if not self._pending[ingress]:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), wait)
        wake.clear()
        return sorted(self._pending.pop(ingress, set()))
