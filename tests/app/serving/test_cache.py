"""Audio cache: LRU over item and byte budgets; hits are identical and never reach an engine."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from websockets.sync.client import connect

from app.serving.cache import AudioCache, CachedAudio, cache_key
from engines.base import Engine
from tests.conftest import LiveServer, decode


def entry(model: str, seconds: float, rate: int = 1000) -> CachedAudio:
    samples = np.linspace(-0.5, 0.5, int(seconds * rate), dtype=np.float32)
    return CachedAudio.build(model, rate, [[samples[: len(samples) // 2]],
                                           [samples[len(samples) // 2:]]])


def key(text: str, **overrides: Any) -> str:
    fields: dict[str, Any] = {"model_id": "piper", "voice": "joe", "speed": 1.0,
                              "language": None, "params": {}, "segments": [text]}
    fields.update(overrides)
    return cache_key(**fields)


def test_byte_budget_evicts_the_least_recently_used() -> None:
    one = entry("piper", 1.0).nbytes  # 4000 bytes of float32
    cache = AudioCache(max_items=100, max_bytes=3 * one, max_item_bytes=3 * one)
    for name in "abc":
        assert cache.put(name, entry("piper", 1.0))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("d", entry("piper", 1.0))
    assert cache.get("b") is None
    assert all(cache.get(k) is not None for k in "acd")
    assert cache.items == 3 and cache.bytes == 3 * one
    cache.put("big", entry("piper", 2.0))  # needs two entries' room
    assert cache.bytes <= 3 * one and cache.get("big") is not None
    assert cache.get("a") is None and cache.get("c") is None


def test_item_budget_and_skip_threshold() -> None:
    cache = AudioCache(max_items=2, max_bytes=1 << 20, max_item_bytes=10_000)
    for name in "abc":
        cache.put(name, entry("piper", 1.0))
    assert cache.items == 2 and cache.get("a") is None
    assert not cache.put("huge", entry("piper", 3.0))  # 12,000 bytes > 10,000
    assert cache.get("huge") is None and cache.skipped == 1


def test_disabled_cache_keeps_nothing() -> None:
    cache = AudioCache(max_items=0, max_bytes=1 << 20, max_item_bytes=1 << 20)
    assert not cache.put("a", entry("piper", 1.0))
    assert cache.get("a") is None and cache.misses == 0


def test_clear_model_drops_only_that_model() -> None:
    cache = AudioCache(max_items=10, max_bytes=1 << 20, max_item_bytes=1 << 20)
    cache.put(key("one"), entry("piper", 1.0))
    cache.put(key("two"), entry("piper", 1.0))
    cache.put(key("one", model_id="kokoro"), entry("kokoro", 1.0))
    assert cache.clear_model("piper") == 2
    assert cache.items == 1 and cache.get(key("one", model_id="kokoro")) is not None


def test_key_is_the_canonical_request() -> None:
    assert key("Hello   there,\n friend.") == key("Hello there, friend.")
    different = [key("Hello."), key("Hello.", voice="amy"), key("Hello.", speed=1.5),
                 key("Hello.", language="en"), key("Hello.", model_id="kokoro"),
                 key("Hello.", params={"noise": 0.5}), key("Hello.", segments=["Hel", "lo."])]
    assert len(set(different)) == len(different)


def test_entries_are_read_only() -> None:
    stored = entry("piper", 1.0)
    with pytest.raises(ValueError):
        stored.chunks[0][0] = 1.0


@pytest.fixture
def engine_calls(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Counts every synthesis call that reaches the piper engine."""
    engine: Engine = server.app.state.service.registry["piper"].engine
    calls: list[str] = []

    def counting(name: str) -> Callable[..., Any]:
        original = getattr(engine, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return original(*args, **kwargs)

        return wrapper

    for name in ("stream", "synthesize"):
        monkeypatch.setattr(engine, name, counting(name))
    yield calls


def fresh_text() -> str:
    return f"Cache check number {random.randrange(10**6)}. The second sentence follows here."


def test_repeat_is_a_hit_with_identical_bytes_and_no_engine_call(
    server: LiveServer, engine_calls: list[str]
) -> None:
    body = {"model": "tts-1", "voice": "alloy", "input": fresh_text(), "response_format": "mp3"}
    with server.client() as http:
        first = http.post("/v1/audio/speech", json=body)
        calls_after_miss = len(engine_calls)
        second = http.post("/v1/audio/speech", json=body)
        as_wav = http.post("/v1/audio/speech", json=body | {"response_format": "wav"})
        sse = http.post("/v1/audio/speech", json=body | {"stream_format": "sse"})
    assert first.headers["x-voxmux-cache"] == "miss" and calls_after_miss >= 2
    assert second.status_code == 200 and second.headers["x-voxmux-cache"] == "hit"
    assert second.content == first.content
    assert as_wav.headers["x-voxmux-cache"] == "hit"
    assert abs(decode(as_wav.content, "wav").duration - decode(first.content, "mp3").duration) < 0.1
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    streamed = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert sse.headers["x-voxmux-cache"] == "hit" and events[-1]["stats"]["cache"] == "hit"
    assert streamed == first.content
    assert len(engine_calls) == calls_after_miss


def test_a_websocket_request_is_served_from_the_cache(
    server: LiveServer, engine_calls: list[str]
) -> None:
    text = fresh_text()
    with server.client() as http:
        wav = http.post("/v1/audio/speech", json={  # the engine's rate, as on the socket
            "model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav"}).content
    pcm = wav[44:]  # after the streaming WAV header
    calls_after_miss = len(engine_calls)
    audio = b""
    with connect(server.url.replace("http", "ws") + "/ws/v1/tts") as ws:
        ws.send(json.dumps({"model": "tts-1", "voice": "alloy", "input": text}))
        for message in ws:
            if isinstance(message, bytes):
                audio += message
                continue
            frame = json.loads(message)
            if frame["type"] in ("done", "error", "cancelled"):
                break
    assert frame["type"] == "done" and frame["stats"]["cache"] == "hit", frame
    assert audio == pcm
    assert len(engine_calls) == calls_after_miss


def test_invalidating_a_model_makes_the_next_request_a_miss(
    server: LiveServer, engine_calls: list[str]
) -> None:
    body = {"model": "tts-1", "voice": "alloy", "input": fresh_text(), "response_format": "pcm"}
    with server.client() as http:
        assert http.post("/v1/audio/speech", json=body).headers["x-voxmux-cache"] == "miss"
        assert http.post("/v1/audio/speech", json=body).headers["x-voxmux-cache"] == "hit"
        assert server.app.state.service.invalidate_model("piper") >= 1
        calls = len(engine_calls)
        again = http.post("/v1/audio/speech", json=body)
    assert again.headers["x-voxmux-cache"] == "miss" and len(engine_calls) > calls
