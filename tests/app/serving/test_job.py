"""The speech job owns what it holds until its engine work has really stopped.

Each test is a failure seen from outside before the serving core was rebuilt: two inferences at
once under `concurrency=1`, a model reported unloaded while it synthesized, a client gone before
the first byte whose job still ran to the end, request ids that overwrote each other, a switch
that unloaded nothing, an unload loop that starved a switch, deep JSON that crashed a session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from app.main import create_app
from app.serving.scheduler import LaneState
from tests.conftest import LiveServer, start_server, test_settings
from tests.reliability.checks import IDLE, hang_up, idle_state, wait_until
from tests.reliability.faulty import (
    MODEL,
    Faults,
    faulty_catalogue,
    faulty_engines,
    start_with_faulty,
)


@pytest.fixture(scope="module")
def faults() -> Faults:
    return Faults(slow_seconds=0.3)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, faults: Faults) -> Iterator[LiveServer]:
    """One engine call at a time per model; the faulty model unloads the moment it is idle."""
    server = start_with_faulty(tmp_path_factory.mktemp("job"), faults, preload=["espeak"],
                               concurrency=1, queue_size=64, model_ttl={MODEL: 0})
    yield server
    faults.release.set()
    server.stop()


@pytest.fixture(autouse=True)
def counted(faults: Faults) -> Iterator[None]:
    faults.reset_counts()
    yield
    faults.release.set()
    faults.release = threading.Event()


def slow_text(segments: int) -> str:
    tag = uuid.uuid4().hex[:8]
    return " ".join(f"SLOW sentence {i} of {tag}." for i in range(segments))


def rows(live: LiveServer) -> list[dict[str, Any]]:
    with live.client() as client:
        data: list[dict[str, Any]] = client.get("/requests").json()["data"]
    return data


def send_raw(live: LiveServer, body: dict[str, Any], request_id: str) -> socket.socket:
    data = json.dumps(body).encode()
    host, port = live.url.removeprefix("http://").rsplit(":", 1)
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"X-Request-ID: {request_id}\r\n\r\n")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(head.encode() + data)
    return sock


def test_a_cancel_storm_never_runs_two_engine_calls_at_once(live: LiveServer,
                                                            faults: Faults) -> None:
    """Cancels, hang-ups and cancel-by-id while every request is mid-inference: with one engine
    call allowed per model, the engine never sees two."""
    tag = uuid.uuid4().hex[:6]

    def one(n: int) -> None:
        request_id = f"storm-{tag}-{n}"
        if n % 2:
            sock = send_raw(live, {"model": MODEL, "input": slow_text(4)}, request_id)
            time.sleep(0.05 + 0.03 * n)
            hang_up(sock)
            return
        with httpx.Client(base_url=live.url, timeout=30) as client, client.stream(
            "POST", "/v1/audio/speech", json={"model": MODEL, "input": slow_text(4)},
            headers={"X-Request-ID": request_id},
        ) as response:
            next(response.iter_raw())  # the first segment is out; the second is running
            client.post(f"/v1/audio/requests/{request_id}/cancel")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(8)))
    assert wait_until(lambda: idle_state(live), IDLE) == IDLE
    assert faults.peak == 1


def test_a_model_with_ttl_0_is_never_unloaded_under_a_running_call(live: LiveServer,
                                                                   faults: Faults) -> None:
    """Requests cancelled mid-inference leave their lease to the engine call: the idle unload
    comes once the call has returned, and /v1/models never says `unloaded` during one."""
    seen_unloaded_while_running = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal seen_unloaded_while_running
        with httpx.Client(base_url=live.url, timeout=30) as client:
            while not stop.is_set():
                running = faults.running
                status = client.get(f"/v1/models/{MODEL}").json()["status"]
                if running and faults.running and status == "unloaded":
                    seen_unloaded_while_running += 1

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for n in range(6):
            sock = send_raw(live, {"model": MODEL, "input": slow_text(3)}, f"ttl0-{n}-x")
            time.sleep(0.15)
            hang_up(sock)
    finally:
        assert wait_until(lambda: idle_state(live), IDLE) == IDLE
        stop.set()
        watcher.join(10)
    assert faults.unloaded_while_running == 0
    assert seen_unloaded_while_running == 0
    assert wait_until(lambda: rows(live)[0]["status"], "cancelled") == "cancelled"


def test_a_client_gone_before_the_first_byte_releases_everything(live: LiveServer,
                                                                 faults: Faults) -> None:
    request_id = f"gone-{uuid.uuid4().hex[:8]}"
    text = slow_text(6)
    hang_up(send_raw(live, {"model": MODEL, "input": text}, request_id))
    assert wait_until(lambda: idle_state(live), IDLE, timeout=10) == IDLE
    row = next(r for r in rows(live) if r["id"] == request_id)
    assert row["status"] == "cancelled" and row["segments_done"] < row["segments"] == 6
    with live.client() as client:  # nothing half-made was cached as if it were whole
        again = client.post("/v1/audio/speech", json={"model": MODEL, "input": text,
                                                      "response_format": "pcm"})
    assert again.status_code == 200 and again.headers["x-voxmux-cache"] == "miss"


async def test_a_response_that_cannot_be_sent_stops_its_job(tmp_path: Path,
                                                            faults: Faults) -> None:
    """The server learns the client is gone only when the headers fail to go out (a reset
    connection): the job is stopped and recorded as cancelled, not run to the end and cached."""
    settings = test_settings(tmp_path, preload=[], catalogue=faulty_catalogue(tmp_path),
                             concurrency=1)
    with faulty_engines(faults):
        app = create_app(settings)
    service = app.state.service
    body = json.dumps({"model": MODEL, "input": slow_text(6)}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/audio/speech", "raw_path": b"/v1/audio/speech", "query_string": b"",
             "root_path": "", "headers": [(b"content-type", b"application/json"),
                                          (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80)}
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    forever = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await forever.wait()  # the reset is never announced: only a write finds it
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("Connection reset by peer")

    try:
        with contextlib.suppress(Exception):  # however the server reports the reset
            await app(scope, receive, send)
        record = service.stats.recent[0]
        for _ in range(100):  # the old core kept synthesizing for the 1.8 s the text takes
            if record.finished:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        assert record.status == "cancelled" and record.segments_done < 6
        assert service.cache.items == 0
        assert service.registry[MODEL].lane.state() == LaneState(0, 0, 0)
    finally:
        service.close()
        await service.registry.close()


def test_requests_sharing_an_id_are_tracked_and_cancelled_together(live: LiveServer) -> None:
    request_id = f"shared-{uuid.uuid4().hex[:8]}"
    outcomes: list[str] = []

    def stream() -> None:
        with httpx.Client(base_url=live.url, timeout=30) as client, client.stream(
            "POST", "/v1/audio/speech", json={"model": MODEL, "input": slow_text(8),
                                              "response_format": "pcm"},
            headers={"X-Request-ID": request_id},
        ) as response:
            try:
                for _ in response.iter_raw():
                    pass
                outcomes.append("complete")
            except httpx.RemoteProtocolError:
                outcomes.append("aborted")

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for thread in threads:
        thread.start()
    # Both are streaming: with one engine call at a time they take turns, segment by segment.
    assert wait_until(lambda: [r["status"] for r in rows(live) if r["id"] == request_id],
                      ["streaming", "streaming"]) == ["streaming", "streaming"]
    with live.client() as client:
        reply = client.post(f"/v1/audio/requests/{request_id}/cancel")
    assert reply.status_code == 200 and reply.json()["requests"] == 2
    for thread in threads:
        thread.join(30)
    assert outcomes == ["aborted", "aborted"]  # neither looks like a whole file
    mine = [r for r in rows(live) if r["id"] == request_id]
    assert [r["status"] for r in mine] == ["cancelled", "cancelled"]
    assert wait_until(lambda: idle_state(live), IDLE) == IDLE


def test_switch_right_after_start_unloads_the_preloaded_model(live: LiveServer) -> None:
    with live.client() as client:
        assert client.get("/v1/models/espeak").json()["current"] is True
        switched = client.post("/v1/models/switch", json={"model": "piper"}).json()
        assert switched["previous"] == "espeak" and switched["previous_unloaded"] is True
        assert client.get("/v1/models/espeak").json()["status"] == "unloaded"
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert models["piper"]["current"] and not models["espeak"]["current"]
        back = client.post("/v1/models/switch", json={"model": "espeak"}).json()
        assert back["previous"] == "piper" and back["previous_unloaded"] is True


def test_an_unload_loop_cannot_starve_a_switch(live: LiveServer, faults: Faults) -> None:
    """Unloads that meet a load in flight are refused at once (409) and change nothing, so the
    switch finishes within one load."""
    faults.load_seconds = 1.0
    stop = threading.Event()
    answers: list[tuple[int, float]] = []

    def unload_loop() -> None:
        with httpx.Client(base_url=live.url, timeout=30) as client:
            while not stop.is_set():
                started = time.monotonic()
                status = client.post(f"/v1/models/{MODEL}/unload").status_code
                answers.append((status, time.monotonic() - started))
                time.sleep(0.2)

    try:
        with live.client() as client:
            client.post(f"/v1/models/{MODEL}/unload")
            looping = threading.Thread(target=unload_loop)
            looping.start()
            time.sleep(0.3)
            started = time.monotonic()
            switched = client.post("/v1/models/switch", json={"model": MODEL})
            took = time.monotonic() - started
    finally:
        stop.set()
        looping.join(10)
        faults.load_seconds = 0.0
    assert switched.status_code == 200 and switched.json()["model"] == MODEL
    assert took < 2.5, took  # one load (1 s), not a load per unload
    refused = [seconds for status, seconds in answers if status == 409]
    assert refused and max(refused) < 0.5  # answered at once, not after the load
    with live.client() as client:
        assert client.post("/v1/models/switch", json={"model": "espeak"}).status_code == 200


@pytest.mark.parametrize("path", ["/ws/v1/tts", "/ws/v1/tts/text", "/v1/stream",
                                  "/v1/stream/text"])
def test_deeply_nested_json_on_a_websocket_is_1003_without_a_traceback(
    live: LiveServer, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = live.url.replace("http://", "ws://", 1) + path
    with caplog.at_level(logging.INFO), connect(url, proxy=None, open_timeout=30) as conn:
        conn.send("[" * 10_000 + "]" * 10_000)
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                conn.recv(timeout=30)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1003
    assert len(closed.value.rcvd.reason) < 80 and "Recursion" not in closed.value.rcvd.reason
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_websocket_text_session_is_one_request(tmp_path_factory: pytest.TempPathFactory
                                                 ) -> None:
    server = start_server(test_settings(tmp_path_factory.mktemp("one"), preload=["espeak"]))
    try:
        url = server.url.replace("http://", "ws://", 1) + "/ws/v1/tts/text"
        with connect(url, proxy=None, open_timeout=30) as conn:
            conn.send(json.dumps({"model": "espeak"}))
            for piece in ["First sentence. ", "Second one! ", "And a third?"]:
                conn.send(json.dumps({"text": piece}))
            conn.send(json.dumps({"type": "end"}))
            frames = []
            with pytest.raises(ConnectionClosed):
                while True:
                    message = conn.recv(timeout=30)
                    if isinstance(message, str):
                        frames.append(json.loads(message))
        assert frames[-1]["type"] == "done" and frames[-1]["sentences"] == 3
        with server.client() as client:
            listed = client.get("/requests").json()["data"]
            stats = client.get("/stats").json()
        assert len(listed) == 1 and listed[0]["status"] == "done"
        assert listed[0]["segments_done"] == 3 and stats["requests"]["total"] == 1
    finally:
        server.stop()


@pytest.fixture
async def espeak_service(tmp_path: Path) -> Any:
    app = create_app(test_settings(tmp_path, preload=[]))
    service = app.state.service
    yield service
    service.close()
    await service.registry.close()


async def _ended(service: Any, job: Any) -> None:
    """What a job that ended must leave: one record, finished; nothing registered or held."""
    assert job.stats is not None and job.stats.outcome == "cancelled"
    assert job.record.status == "cancelled" and job.record.finished
    assert service.running() == [] and not service._by_request_id
    assert service.stats.counts["cancelled"] == 1 and service.stats.total == 1
    assert service.registry["espeak"].lane.state() == LaneState(0, 0, 0)
    with pytest.raises(Exception, match="cancelled"):  # the reader sees the end, at once
        async with asyncio.timeout(1):
            await job.whole()


async def test_a_job_cancelled_before_its_task_ran_ends_once(espeak_service: Any) -> None:
    """Cancelled between `start()` and the first step of its task: it still ends, once, and
    closing it raises nothing into the caller."""
    plan = await espeak_service.plan(model="espeak", text="A job nobody will hear.")
    job = espeak_service.speak(plan)
    job.start()
    job.cancel()  # before the event loop ran the job's task at all
    async with asyncio.timeout(5):
        await job.close()
    await _ended(espeak_service, job)


async def test_a_cancel_by_id_racing_the_start_ends_the_job(espeak_service: Any) -> None:
    plan = await espeak_service.plan(model="espeak", text="Cancelled as it starts.",
                                     request_id="racing-start-1")
    job = espeak_service.speak(plan)
    async with asyncio.timeout(5):
        async with job:
            assert espeak_service.cancel("racing-start-1") == 1
    await _ended(espeak_service, job)


class _GoneSocket:
    """A WebSocket whose client left as soon as it had sent its request: every send fails."""

    def __init__(self, request: dict[str, Any]) -> None:
        self._messages = [{"type": "websocket.receive", "text": json.dumps(request)}]

    async def accept(self) -> None:
        return None

    async def receive(self) -> dict[str, Any]:
        if self._messages:
            return self._messages.pop()
        await asyncio.Event().wait()  # the disconnect is never announced
        return {"type": "websocket.disconnect"}

    async def send_json(self, data: Any) -> None:
        raise OSError("Connection reset by peer")

    send_bytes = send_json

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        raise OSError("Connection reset by peer")


async def test_a_websocket_client_gone_before_started_ends_its_job(espeak_service: Any) -> None:
    from app.protocols.schemas import WsSpeechRequest
    from app.protocols.voxmux_ws import VoxMuxFraming
    from app.protocols.websocket import ConnectionGate, OneRequest, Session

    socket = _GoneSocket({"model": "espeak", "input": "Nobody is left to hear this."})
    session = Session(socket, espeak_service, "gone-before-started", "addr:test",  # type: ignore[arg-type]
                      VoxMuxFraming(text_in=False), OneRequest(WsSpeechRequest,
                                                               cancel_message=True))
    gate = ConnectionGate(4, 4)
    async with asyncio.timeout(5):
        await session.run(gate)  # returns: no CancelledError, no hang
    assert gate.open == 0
    await _ended(espeak_service, session._job)
