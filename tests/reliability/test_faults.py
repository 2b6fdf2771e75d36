"""Fault injection: an engine that raises mid-stream, hangs, or fails to load, beside a real one.

After every fault the client got a clean answer in OpenAI's shape (a status before the headers, an
SSE `error` event or WS `error` frame after them, an aborted transfer for raw audio), the faulty
model's lease is back to 0, and eSpeak still speaks.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.conftest import LiveServer, decode
from tests.reliability.checks import IDLE, assert_openai_error, idle_state, wait_until
from tests.reliability.faulty import MODEL, RATE, Faults, start_with_faulty

TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def faults() -> Faults:
    return Faults()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, faults: Faults) -> Iterator[LiveServer]:
    server = start_with_faulty(tmp_path_factory.mktemp("faults"), faults, preload=["espeak"],
                               request_timeout=TIMEOUT_S, concurrency=2)
    yield server
    faults.release.set()
    server.stop()


@pytest.fixture(autouse=True)
def cleared(faults: Faults) -> Iterator[None]:
    yield
    faults.release.set()  # a hung engine thread returns; the next hang waits on a new event
    faults.release = type(faults.release)()
    faults.hung.clear()
    faults.load_error = None
    faults.reset_counts()


def text(*sentences: str) -> str:
    """Unique sentences (cache on): the first is always fine, later ones carry the faults."""
    tag = uuid.uuid4().hex[:8]
    return " ".join(f"{s} {tag}." for s in sentences)


def refcount(live: LiveServer, model: str = MODEL) -> int:
    return int(live.app.state.service.registry.status()[model].refcount)


def assert_recovered(live: LiveServer) -> None:
    """The faulty lease is released, nothing is left running, and eSpeak still speaks."""
    assert wait_until(lambda: idle_state(live), IDLE) == IDLE
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": "espeak", "input": text("The real engine still speaks"),
            "response_format": "wav"})
    assert response.status_code == 200
    audio = decode(response.content, "wav")
    assert audio.duration > 0.5 and audio.rms > 0.01


def sse_events(live: LiveServer, body: dict[str, Any]) -> list[dict[str, Any]]:
    with live.client() as client, client.stream(
        "POST", "/v1/audio/speech", json=body | {"stream_format": "sse"}
    ) as response:
        assert response.status_code == 200
        return [json.loads(line[5:]) for line in response.iter_lines() if line.startswith("data:")]


def ws_frames(live: LiveServer, request: dict[str, Any]) -> tuple[list[Any], int | None]:
    frames: list[Any] = []
    url = live.url.replace("http://", "ws://", 1) + "/ws/v1/tts"
    with connect(url, proxy=None, open_timeout=30) as conn:
        conn.send(json.dumps(request))
        try:
            while True:
                message = conn.recv(timeout=30)
                frames.append(message if isinstance(message, bytes) else json.loads(message))
        except ConnectionClosed as exc:
            return frames, exc.rcvd.code if exc.rcvd else None


# -- raises mid-stream ---------------------------------------------------------------------------

def test_raw_audio_stream_is_aborted_and_logged_when_the_engine_fails_mid_stream(
    live: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"model": MODEL, "input": text("First sentence is fine", "BOOM breaks the second"),
            "response_format": "pcm"}
    received = b""
    with caplog.at_level(logging.WARNING), live.client() as client, pytest.raises(
        httpx.RemoteProtocolError
    ), client.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            received += chunk
    # The first sentence arrived; the transfer then broke off, so no client mistakes the
    # truncated audio for a whole file.
    first = decode(received, "pcm", pcm_rate=RATE)
    assert 0.3 < first.duration < 2.0
    assert any("aborted after streaming began" in r.getMessage() for r in caplog.records)
    assert_recovered(live)


def test_sse_stream_ends_with_an_error_event(live: LiveServer) -> None:
    events = sse_events(live, {"model": MODEL, "input": text("Fine start", "BOOM then")})
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error"
    error = assert_openai_error({"error": events[-1]["error"]})
    assert error["code"] == "synthesis_failed" and "faulty" in error["message"]
    assert "speech.audio.done" not in [e["type"] for e in events]
    assert_recovered(live)


def test_websocket_gets_an_error_frame(live: LiveServer) -> None:
    frames, code = ws_frames(live, {"model": MODEL, "input": text("Fine start", "BOOM then")})
    assert frames[0]["type"] == "started"
    assert any(isinstance(f, bytes) for f in frames)  # the first sentence's audio
    assert frames[-1]["type"] == "error"
    error = assert_openai_error({"error": frames[-1]["error"]})
    assert error["code"] == "synthesis_failed"
    assert code == 1000
    assert_recovered(live)


def test_failure_on_the_first_segment_is_a_500_before_any_audio(live: LiveServer) -> None:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={"model": MODEL, "input": text("BOOM")})
    assert response.status_code == 500
    error = assert_openai_error(response.json())
    assert error["code"] == "synthesis_failed" and "Traceback" not in error["message"]
    assert_recovered(live)


# -- hangs ---------------------------------------------------------------------------------------

def test_hang_before_the_first_audio_is_a_504_and_stops_the_engine(
    live: LiveServer, faults: Faults
) -> None:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={"model": MODEL, "input": text("HANG")})
    assert response.status_code == 504
    assert assert_openai_error(response.json())["code"] == "timeout"
    assert faults.hung.is_set()
    # The timeout cancelled the engine call, which stopped: its turn and lease are free.
    assert_recovered(live)
    with live.client() as client:
        again = client.post("/v1/audio/speech", json={
            "model": MODEL, "input": text("Another request to the same model"),
            "response_format": "wav"})
    assert again.status_code == 200 and decode(again.content, "wav").duration > 0.5


def in_flight(live: LiveServer, model: str = MODEL) -> float:
    with live.client() as client:
        text = client.get("/metrics").text
    line = next(line for line in text.splitlines()
                if line.startswith(f'voxmux_engine_calls_in_flight{{model="{model}"}}'))
    return float(line.split()[-1])


def test_an_engine_that_cannot_be_stopped_keeps_its_turn_until_it_returns(
    live: LiveServer, faults: Faults
) -> None:
    """The client hears its 504 on time, but the engine call it abandoned still runs: its turn,
    its lease and its request place stay held, visibly, until the call returns."""
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={"model": MODEL, "input": text("STUCK")})
        assert response.status_code == 504
        assert faults.hung.is_set() and faults.running == 1
        assert in_flight(live) == 1
        assert client.get(f"/v1/models/{MODEL}").json()["running"] == 1
        assert refcount(live) == 1
        refused = client.post(f"/v1/models/{MODEL}/unload")
        assert refused.status_code == 409  # never unloaded under a running call
        rows = [r for r in client.get("/requests").json()["data"] if r["model"] == MODEL]
        assert rows[0]["status"] == "running"  # ended for its client, not yet for the engine
    faults.release.set()
    assert_recovered(live)
    with live.client() as client:
        rows = [r for r in client.get("/requests").json()["data"] if r["model"] == MODEL]
    assert rows[0]["status"] == "timeout"
    assert in_flight(live) == 0


def test_hang_after_the_first_audio_is_an_error_event_and_frame(live: LiveServer) -> None:
    events = sse_events(live, {"model": MODEL, "input": text("Fine start", "HANG then")})
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "timeout"
    frames, code = ws_frames(live, {"model": MODEL, "input": text("Fine start", "HANG again")})
    assert frames[-1]["type"] == "error" and frames[-1]["error"]["code"] == "timeout"
    assert code == 1000
    assert_recovered(live)


# -- fails to load -------------------------------------------------------------------------------

def test_load_failure_is_a_503_then_a_retry_works_once_cleared(
    live: LiveServer, faults: Faults
) -> None:
    with live.client() as client:
        assert client.post(f"/v1/models/{MODEL}/unload").status_code == 200
        faults.load_error = "weights file is corrupt"
        response = client.post("/v1/audio/speech", json={"model": MODEL, "input": text("Hello")})
        assert response.status_code == 503
        error = assert_openai_error(response.json())
        assert error["code"] == "model_load_failed"
        assert "weights file is corrupt" in error["message"]

        card = client.get(f"/v1/models/{MODEL}").json()
        assert card["status"] == "error" and "weights file is corrupt" in card["error"]
        assert client.get("/health").json()["status"] == "degraded"
        assert refcount(live) == 0
        assert_recovered(live)  # others unaffected

        faults.load_error = None
        attempts = faults.loads
        retry = client.post("/v1/audio/speech", json={
            "model": MODEL, "input": text("Hello again"), "response_format": "wav"})
        assert retry.status_code == 200 and decode(retry.content, "wav").duration > 0.3
        assert faults.loads == attempts + 1  # the failed load was retried by this request
        assert client.get(f"/v1/models/{MODEL}").json()["status"] == "ready"
        assert client.get("/health").json()["status"] == "ok"


def test_load_failure_reaches_websocket_clients_as_an_error_frame(
    live: LiveServer, faults: Faults
) -> None:
    with live.client() as client:
        assert client.post(f"/v1/models/{MODEL}/unload").status_code == 200
    faults.load_error = "no such runtime"
    frames, code = ws_frames(live, {"model": MODEL, "input": text("Hello")})
    assert [f["type"] for f in frames if isinstance(f, dict)][-1] == "error"
    assert frames[-1]["error"]["code"] == "model_load_failed"
    assert code == 1000
    assert not any(isinstance(f, bytes) for f in frames)
    assert_recovered(live)


def test_the_faulty_model_still_answers_base64_sse_deltas_after_all_this(live: LiveServer) -> None:
    events = sse_events(live, {"model": MODEL, "input": text("All good now", "Really good"),
                               "response_format": "pcm"})
    audio = b"".join(base64.b64decode(e["audio"]) for e in events
                     if e["type"] == "speech.audio.delta")
    assert events[-1]["type"] == "speech.audio.done"
    assert decode(audio, "pcm", pcm_rate=RATE).duration > 1.0


# -- slow engine: every slot runs ----------------------------------------------------------------

def test_every_configured_slot_synthesizes_at_once(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """More slots than asyncio's default thread pool has threads (cores + 4): all run at once."""
    slots = min(32, (os.cpu_count() or 1) + 4) + 2
    faults = Faults(slow_seconds=1.5)
    server = start_with_faulty(tmp_path_factory.mktemp("slots"), faults, preload=[MODEL],
                               concurrency=slots, queue_size=64)
    try:
        def one(_: int) -> int:
            with server.client() as client:
                return client.post("/v1/audio/speech", json={
                    "model": MODEL, "input": text("SLOW"), "response_format": "pcm"}).status_code

        with ThreadPoolExecutor(slots) as pool:
            statuses = list(pool.map(one, range(slots)))
        assert statuses == [200] * slots
        assert faults.peak == slots
    finally:
        server.stop()
