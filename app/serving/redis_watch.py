"""Whether the deployment's Redis answers, for `/health`.

Everything that uses Redis goes on without it (the shared cache misses, cancels stay on the
replica that received them, the Redis job store waits and reconnects), so a Redis that is out
never fails a request; it makes `/health` say `degraded` and why. One `PING` answers for
`FRESH_SECONDS`, however many status reads ask meanwhile, and a `PING` waits at most
`PING_SECONDS` (an address that swallows packets must not hold `/health`).
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import redis.asyncio as redis
from redis.exceptions import RedisError

PING_SECONDS = 1.0
FRESH_SECONDS = 2.0


class RedisWatch:
    def __init__(self, url: str) -> None:
        self.where = urlsplit(url).netloc.rpartition("@")[2] or url  # never the password
        self._redis = redis.Redis.from_url(url, socket_connect_timeout=PING_SECONDS,
                                           socket_timeout=PING_SECONDS)
        self._problem: str | None = None
        self._checked = -FRESH_SECONDS
        self._lock = asyncio.Lock()

    async def problem(self) -> str | None:
        """None while Redis answers; else what `/health` says of it."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            if loop.time() - self._checked >= FRESH_SECONDS:
                self._problem = await self._ping()
                self._checked = loop.time()
            return self._problem

    async def _ping(self) -> str | None:
        try:
            async with asyncio.timeout(PING_SECONDS * 2):
                await self._redis.ping()
            return None
        except (RedisError, OSError, TimeoutError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return (f"Redis at {self.where} does not answer ({reason}): the shared cache "
                    "misses, cancels reach only the replica that receives them, and shared "
                    "jobs wait until it is back")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._redis.aclose()
