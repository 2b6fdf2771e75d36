"""Cancel by id between ingress replicas through a real Redis that stops and comes back: while
it is out, a cancel answers what this replica cancelled (it raised `ConnectionError`: a 500),
and once it is back on its port the replicas hear each other again."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import urlsplit

from app.cluster.cancels import CHANNEL, RETRY_SECONDS, RedisCancels
from tests.redisserver import redis_server


async def subscribed_again(url: str) -> None:
    """Until the listener has subscribed to the restarted Redis (it retries every
    `RETRY_SECONDS`), as Redis itself counts the channel's subscribers."""
    import redis.asyncio as redis
    from redis.exceptions import RedisError

    client = redis.Redis.from_url(url)
    try:
        for _ in range(int((RETRY_SECONDS + 10) / 0.05)):
            with contextlib.suppress(RedisError, OSError):
                if dict(await client.pubsub_numsub(CHANNEL)).get(CHANNEL.encode()):
                    return
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()


def test_a_cancel_outlives_a_redis_that_stops_and_comes_back(tmp_path: Path) -> None:
    want_stop, stopped, restarted = threading.Event(), threading.Event(), threading.Event()
    heard: list[str] = []

    async def replicas(url: str) -> list[int]:
        asker, other = RedisCancels(url, "asker"), RedisCancels(url, "other")

        def cancel(request_id: str) -> int:  # the other replica runs each id once
            heard.append(request_id)
            return 1

        watching = asyncio.create_task(other.watch(cancel))
        try:
            await asyncio.sleep(0.5)  # subscribed
            found = [await asker.cancel("before")]
            want_stop.set()
            await asyncio.to_thread(stopped.wait, 30)
            found.append(await asker.cancel("while-out"))
            await asyncio.to_thread(restarted.wait, 30)
            await subscribed_again(url)
            found.append(await asker.cancel("after"))
            return found
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await asker.close()
            await other.close()

    result: Future[list[int]] = Future()

    def run(url: str) -> None:
        try:
            result.set_result(asyncio.run(replicas(url)))
        except BaseException as exc:
            result.set_exception(exc)

    with redis_server(tmp_path / "first") as url:
        thread = threading.Thread(target=run, args=(url,), daemon=True)
        thread.start()
        assert want_stop.wait(30)
    stopped.set()
    with redis_server(tmp_path / "second", port=urlsplit(url).port):
        restarted.set()
        found = result.result(timeout=60)
    assert found == [1, 0, 1]
    assert heard == ["before", "after"]
