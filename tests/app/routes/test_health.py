"""`/health` says `degraded`, and why, when the deployment's Redis stops answering, while speech
goes on (the shared cache misses); once Redis is back on its port it says `ok` again."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

from app.serving.redis_watch import FRESH_SECONDS
from tests.conftest import decode, start_server, test_settings
from tests.redisserver import redis_server


def test_health_names_a_redis_that_does_not_answer(tmp_path: Path) -> None:
    with redis_server(tmp_path / "first") as url:
        live = start_server(test_settings(tmp_path, preload=["espeak"], cache_url=url))
        with live.client() as client:
            before = client.get("/health").json()
    try:
        assert before["status"] == "ok" and before["warnings"] == []
        with live.client() as client:
            time.sleep(FRESH_SECONDS)
            started = time.monotonic()
            out = client.get("/health").json()
            waited = time.monotonic() - started
            spoken = client.post("/v1/audio/speech", json={
                "model": "espeak", "input": "Redis is out, speech is not.",
                "response_format": "wav"})
        assert out["status"] == "degraded", out
        assert any("Redis at 127.0.0.1" in w and "does not answer" in w
                   for w in out["warnings"]), out["warnings"]
        assert waited < 5  # a refused connection is told at once, never a hang
        assert spoken.status_code == 200 and decode(spoken.content, "wav").duration > 0.5
        with redis_server(tmp_path / "second", port=urlsplit(url).port):
            time.sleep(FRESH_SECONDS)
            with live.client() as client:
                again = client.get("/health").json()
        assert again["status"] == "ok" and again["warnings"] == [], again
    finally:
        live.stop()
