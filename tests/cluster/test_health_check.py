"""An engine replica's health check, as Serve calls it: it fails on an engine call that has run
past the request timeout and a grace (a hung inference), and on a model that failed to load
while nothing renders on the replica; Serve then replaces the replica."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from app.cluster import engines
from app.cluster.engines import Engines
from app.serving.scheduler import Lane
from engines.base import CancelToken
from engines.registry import ModelStatus


def replica(handles: list[Any], sessions: dict[str, dict[str, bool]] | None = None) -> Any:
    """What `check_health` reads of a replica: its settings, its registry's handles, and its
    render sessions."""
    return SimpleNamespace(settings=SimpleNamespace(request_timeout=0.2),
                           registry=SimpleNamespace(handles=lambda: handles),
                           _sessions=sessions or {})


def handle(model: str, lane: Lane, status: ModelStatus = ModelStatus.READY,
           error: str | None = None) -> Any:
    return SimpleNamespace(id=model, lane=lane, status=status, error=error)


def test_a_hung_engine_call_fails_the_health_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "STUCK_GRACE_SECONDS", 0.3)
    lane = Lane("hung", 1, 1)
    release = threading.Event()
    entered = threading.Event()

    def hang() -> None:  # an inference that ignores its cancel token
        entered.set()
        release.wait(30)

    async def call() -> None:
        async with lane.turn("t", None) as turn:
            await turn.call(hang, CancelToken(), None)

    async def scenario() -> list[str]:
        checks = []
        task = asyncio.create_task(call())
        await asyncio.to_thread(entered.wait, 10)
        Engines.check_health(replica([handle("hung", lane)]))  # young: healthy
        await asyncio.sleep(0.7)  # past the timeout and the grace
        try:
            Engines.check_health(replica([handle("hung", lane)]))
        except RuntimeError as exc:
            checks.append(str(exc))
        release.set()
        await task
        Engines.check_health(replica([handle("hung", lane)]))  # it returned: healthy again
        return checks

    try:
        (failed,) = asyncio.run(scenario())
    finally:
        release.set()
        lane.close()
    assert "'hung'" in failed and "has run" in failed


def test_a_model_that_failed_to_load_fails_it_once_nothing_renders() -> None:
    lane = Lane("broken", 1, 1)
    try:
        broken = handle("broken", lane, ModelStatus.ERROR, "the model file is missing")
        with pytest.raises(RuntimeError, match="the model file is missing"):
            Engines.check_health(replica([broken]))
        # Another model streams on the replica: a restart would cut it; the next check fails.
        Engines.check_health(replica([broken], {"piper": {"ticket": True}}))
        Engines.check_health(replica([handle("fine", lane)]))
    finally:
        lane.close()
