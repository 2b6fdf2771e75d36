"""Work that stops when its client hangs up, for routes that answer only once it is done."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

from engines.base import Cancelled

T = TypeVar("T")


async def _hung_up(request: Request) -> None:
    """Return when the client disconnects (its body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result; when the client hangs up first, `work` is cancelled (and waited for:
    whatever it holds is released) and `Cancelled` raised."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_hung_up(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise Cancelled("The client disconnected")
    finally:
        for running in (watcher, task):
            running.cancel()
        await asyncio.gather(watcher, task, return_exceptions=True)
