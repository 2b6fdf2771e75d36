"""The Studio's clips in the shared tier (Redis), so that the ingress replica a browser's
`<audio>` request reaches finds the clip another replica made. Each clip expires like the
in-process store's (an hour); the size bound is the same. A clip is a JSON header and its bytes;
nothing is unpickled."""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import asdict

import redis.asyncio as redis
from redis.exceptions import RedisError

from app.serving.redis_cache import PREFIX
from app.studio.view import Clip

log = logging.getLogger(__name__)


class RedisClipStore:
    def __init__(self, url: str, max_bytes: int = 64 << 20, ttl: float = 3600) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self.max_bytes = max_bytes
        self.ttl = int(ttl)

    def _key(self, clip_id: str) -> str:
        return f"{PREFIX}clip:{clip_id}"

    async def put(self, clip: Clip) -> bool:
        if len(clip.data) > self.max_bytes:
            return False
        header = json.dumps({k: v for k, v in asdict(clip).items() if k != "data"}).encode()
        try:
            await self._redis.set(self._key(clip.id),
                                  struct.pack(">I", len(header)) + header + clip.data,
                                  ex=self.ttl)
        except (RedisError, OSError) as exc:
            log.warning("studio: could not store a clip in the shared tier: %s", exc)
            return False
        return True

    async def get(self, clip_id: str) -> Clip | None:
        try:
            blob = await self._redis.get(self._key(clip_id))
        except (RedisError, OSError) as exc:
            log.warning("studio: could not read a clip from the shared tier: %s", exc)
            return None
        if not isinstance(blob, bytes):
            return None
        (size,) = struct.unpack_from(">I", blob)
        fields = json.loads(blob[4:4 + size])
        return Clip(data=bytes(blob[4 + size:]), **fields)
