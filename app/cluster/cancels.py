"""Cancel by request id across ingress replicas, through Redis pub/sub (`VOXMUX_CACHE_URL`).

`POST /v1/audio/requests/{id}/cancel` lands on whichever ingress replica Serve's proxy picks. That
replica cancels its own requests and publishes the id on one channel; every other ingress replica
is subscribed, cancels the requests it runs with that id and answers how many on a reply list
that only this cancel knows. `PUBLISH` says how many replicas heard it, so the asker waits for
exactly their answers (at most `REPLY_SECONDS`). Nothing is registered per request and nothing is
left behind by a replica that died: it simply no longer listens.

Without Redis a cancel reaches only the requests of the replica that received it (`/health` says
so when there are several). A Redis that stops answering is the same for as long as it is out:
the cancel answers with what this replica cancelled (never a 500), the channel is listened to
again once Redis is back, and `/health` says `degraded` meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

CHANNEL = "{voxmux}:cancel"
REPLY_SECONDS = 2.0
"""How long a cancel waits for the other replicas' answers."""
RETRY_SECONDS = 1.0


class Cancels(Protocol):
    shared: bool
    """Whether a cancel reaches the other ingress replicas."""

    async def cancel(self, request_id: str) -> int:
        """Cancel `request_id` on the other ingress replicas; how many requests that was."""

    async def watch(self, cancel: Callable[[str], int]) -> None:
        """Run `cancel` for every id another replica was asked to cancel; forever."""

    async def close(self) -> None: ...


class LocalCancels:
    """No Redis: a cancel stays on the replica that received it."""

    shared = False

    async def cancel(self, request_id: str) -> int:
        return 0

    async def watch(self, cancel: Callable[[str], int]) -> None:
        await asyncio.Event().wait()

    async def close(self) -> None:
        pass


class RedisCancels:
    shared = True

    def __init__(self, url: str, replica: str) -> None:
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(url, socket_connect_timeout=2)
        self._replica = replica
        self._listening = False

    async def cancel(self, request_id: str) -> int:
        from redis.exceptions import RedisError

        try:
            return await self._cancel(request_id)
        except (RedisError, OSError, TimeoutError) as exc:
            log.warning("cancel of %s stays on this replica: Redis does not answer (%s)",
                        request_id, exc)
            return 0

    async def _cancel(self, request_id: str) -> int:
        reply = f"{{voxmux}}:cancelled:{uuid.uuid4().hex}"
        message = json.dumps({"id": request_id, "reply": reply, "from": self._replica})
        heard: int = await self._redis.publish(CHANNEL, message)
        count = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLY_SECONDS
        for _ in range(heard - self._listening):
            remaining = deadline - loop.time()
            answer = await self._redis.blpop([reply], timeout=max(0.01, remaining))
            if answer is None:
                break
            count += int(answer[1])
        await self._redis.delete(reply)
        return count

    async def watch(self, cancel: Callable[[str], int]) -> None:
        while True:
            try:
                async with self._redis.pubsub() as pubsub:
                    await pubsub.subscribe(CHANNEL)
                    self._listening = True
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            await self._answer(json.loads(message["data"]), cancel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting: cancels stay local meanwhile
                log.warning("cancel channel lost (%s); retrying", exc)
            finally:
                self._listening = False
            await asyncio.sleep(RETRY_SECONDS)

    async def _answer(self, message: dict[str, str], cancel: Callable[[str], int]) -> None:
        if message.get("from") == self._replica:
            return
        count = cancel(message["id"])
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.rpush(message["reply"], count)
            pipe.expire(message["reply"], 60)
            await pipe.execute()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._redis.aclose()


def open_cancels(url: str | None, replica: str) -> Cancels:
    return RedisCancels(url, replica) if url else LocalCancels()
