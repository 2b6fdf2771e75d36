"""Which blocking calls ran on an event loop's thread.

A loop that stalls is found without a clock: the calls that must run in worker threads are
wrapped, and each call made from a thread that is running an event loop is written down. The
tests still bound how long `/health` waited, but only by the generous second the issues ask: a
shared machine's load made it wait 0.43 s with nothing on the loop."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import Any

import pytest


class OnLoop:
    """The names of the guarded calls made on an event loop's thread, in the order made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch
        self.calls: list[str] = []

    def guard(self, owner: object, names: Iterable[str],
              before: Callable[[], None] | None = None) -> OnLoop:
        """Wraps `owner`'s callables `names` (those it has); `before` runs ahead of each call,
        in the caller's thread (a delay, to make a stall that would go unseen long)."""
        for name in names:
            if hasattr(owner, name):
                self._monkeypatch.setattr(owner, name, self._wrap(name, getattr(owner, name),
                                                                  before))
        return self

    def _wrap(self, name: str, call: Callable[..., Any],
              before: Callable[[], None] | None) -> Callable[..., Any]:
        @functools.wraps(call)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                asyncio.get_running_loop()
                self.calls.append(name)
            except RuntimeError:
                pass  # a worker thread: no loop runs here
            if before is not None:
                before()
            return call(*args, **kwargs)
        return guarded
