"""The board deployment: the engine replicas' latest reports, read by the status routes.

Each engine replica reports its `ReplicaState` when something changes and at least every
`REPORT_SECONDS`; a replica that stops reporting (it died, or was scaled down without saying
goodbye) leaves the board after `STALE_SECONDS`.
"""

from __future__ import annotations

import time

from app.cluster.engines import REPORT_SECONDS
from app.serving.fleet import ReplicaState

STALE_SECONDS = 5 * REPORT_SECONDS


class Board:
    def __init__(self) -> None:
        self._states: dict[str, ReplicaState] = {}
        self._seen: dict[str, float] = {}

    def report(self, state: ReplicaState) -> None:
        self._states[state.id] = state
        self._seen[state.id] = time.monotonic()

    def forget(self, replica: str) -> None:
        self._states.pop(replica, None)
        self._seen.pop(replica, None)

    def replicas(self) -> list[ReplicaState]:
        now = time.monotonic()
        for replica, seen in list(self._seen.items()):
            if now - seen > STALE_SECONDS:
                self.forget(replica)
        return sorted(self._states.values(), key=lambda s: s.id)
