"""A real `redis-server` (Debian's package) on a free loopback port, started and stopped here."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.conftest import free_port

REDIS_SERVER = shutil.which("redis-server")


@contextmanager
def redis_server(folder: Path, maxmemory: str = "64mb", policy: str = "allkeys-lru",
                 port: int | None = None) -> Iterator[str]:
    """A fresh server with no persistence, `maxmemory` and its eviction `policy` (LRU for a
    cache; "noeviction" for data that must not be lost, such as jobs), on `port` or a free
    one; yields its URL."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    port = port or free_port()
    folder.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder), "--maxmemory", maxmemory,
         "--maxmemory-policy", policy],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
