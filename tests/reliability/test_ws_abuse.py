"""WebSocket abuse: oversized and binary frames, silence, endless text, a client that never reads,
garbage after a request, and clients that vanish mid-handshake.

Each case checks the close code and error frame a client sees, and that the server kept nothing:
no lease, slot, open stream or connection place, and a normal session works right after.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.conftest import LiveServer, decode
from tests.reliability.checks import (
    IDLE,
    RESET,
    WAITING,
    assert_openai_error,
    hang_up,
    idle_state,
    wait_until,
)
from tests.reliability.faulty import MODEL, Faults, start_with_faulty

MAX_MESSAGE = 8192
PENDING = 3000
SEND_TIMEOUT = 4.0
ESPEAK_RATE = 22050


@pytest.fixture(scope="module")
def faults() -> Faults:
    return Faults(slow_seconds=1.5)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, faults: Faults) -> Iterator[LiveServer]:
    server = start_with_faulty(
        tmp_path_factory.mktemp("ws-abuse"), faults, preload=["espeak"],
        ws_first_message_timeout=1.0, ws_max_message_bytes=MAX_MESSAGE,
        ws_max_pending_chars=PENDING, ws_send_timeout=SEND_TIMEOUT,
    )
    yield server
    faults.release.set()
    server.stop()


def url(live: LiveServer, path: str) -> str:
    return live.url.replace("http://", "ws://", 1) + path


def ws(live: LiveServer, path: str = "/ws/v1/tts", **kwargs: Any) -> ClientConnection:
    conn: ClientConnection = connect(url(live, path), proxy=None, open_timeout=30, **kwargs)
    return conn


def read_all(conn: ClientConnection, timeout: float = 30) -> tuple[list[Any], int | None]:
    """Frames (JSON decoded, audio as bytes) until the server closes, and the close code."""
    frames: list[Any] = []
    try:
        while True:
            message = conn.recv(timeout=timeout)
            frames.append(message if isinstance(message, bytes) else json.loads(message))
    except ConnectionClosed as exc:
        return frames, exc.rcvd.code if exc.rcvd else None


def json_frames(frames: list[Any]) -> list[dict[str, Any]]:
    return [f for f in frames if isinstance(f, dict)]


def gate_open(live: LiveServer) -> int:
    gate = getattr(live.app.state, "ws_gate", None)
    return int(gate.open) if gate is not None else 0


def assert_clean(live: LiveServer) -> None:
    """Nothing held, no session left open, and a normal request still works."""
    assert wait_until(lambda: idle_state(live), IDLE) == IDLE
    assert wait_until(lambda: gate_open(live), 0) == 0
    with ws(live) as conn:
        conn.send(json.dumps({"model": "espeak", "input": f"Fine again {uuid.uuid4().hex}."}))
        frames, code = read_all(conn)
    assert code == 1000 and json_frames(frames)[-1]["type"] == "done"
    audio = b"".join(f for f in frames if isinstance(f, bytes))
    assert decode(audio, "pcm", pcm_rate=ESPEAK_RATE).duration > 0.5


def story(sentences: int) -> str:
    tag = uuid.uuid4().hex[:8]
    return " ".join(f"Line {i} of the tale {tag} drifts along the quiet shore."
                    for i in range(sentences))


# -- frames the server refuses -------------------------------------------------------------------

def test_oversized_first_message_closes_with_1009(live: LiveServer) -> None:
    with ws(live) as conn:
        conn.send(json.dumps({"model": "espeak", "input": "x" * MAX_MESSAGE}))
        frames, code = read_all(conn)
    assert code == 1009
    assert assert_openai_error({"error": frames[-1]["error"]})["code"] == "message_too_large"
    assert_clean(live)


def test_oversized_message_mid_request_closes_with_1009_and_frees_the_lease(
    live: LiveServer,
) -> None:
    with ws(live) as conn:
        conn.send(json.dumps({"model": "espeak", "input": story(40)}))
        assert json.loads(conn.recv(timeout=30))["type"] == "started"
        conn.send(json.dumps({"type": "note", "text": "y" * (2 * MAX_MESSAGE)}))
        frames, code = read_all(conn)
    assert code == 1009
    assert json_frames(frames)[-1]["error"]["code"] == "message_too_large"
    assert_clean(live)


def test_frame_over_the_servers_size_limit_is_refused_by_the_protocol(live: LiveServer) -> None:
    with ws(live, max_size=None) as conn:
        conn.send("z" * (2 << 20))  # over uvicorn's ws_max_size (1 MiB)
        _, code = read_all(conn)
    assert code == 1009
    assert_clean(live)


@pytest.mark.parametrize("path", ["/ws/v1/tts", "/ws/v1/tts/text"])
def test_binary_first_frame_closes_with_1003(live: LiveServer, path: str) -> None:
    with ws(live, path) as conn:
        conn.send(b"\x00\x01binary")
        frames, code = read_all(conn)
    assert code == 1003
    assert assert_openai_error({"error": frames[-1]["error"]})["code"] == "invalid_json"
    assert_clean(live)


def test_binary_frame_mid_text_session_closes_with_1003(live: LiveServer) -> None:
    with ws(live, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "espeak"}))
        assert json.loads(conn.recv(timeout=30))["type"] == "started"
        conn.send(json.dumps({"text": "A first sentence that is spoken. "}))
        conn.send(b"\xff" * 100)
        frames, code = read_all(conn)
    assert code == 1003
    assert json_frames(frames)[-1]["error"]["code"] == "invalid_json"
    assert_clean(live)


@pytest.mark.parametrize("garbage", ["not json at all", "[1, 2, 3]", "{\"type\": "])
def test_garbage_after_a_request_closes_with_1003_and_frees_the_lease(
    live: LiveServer, garbage: str
) -> None:
    with ws(live) as conn:
        conn.send(json.dumps({"model": "espeak", "input": story(30)}))
        assert json.loads(conn.recv(timeout=30))["type"] == "started"
        conn.send(garbage)
        frames, code = read_all(conn)
    assert code == 1003
    assert json_frames(frames)[-1]["type"] == "error"
    assert_clean(live)


@pytest.mark.parametrize("path", ["/ws/v1/tts", "/ws/v1/tts/text"])
def test_a_lone_surrogate_is_a_request_error_not_a_server_failure(
    live: LiveServer, path: str
) -> None:
    with ws(live, path) as conn:
        conn.send('{"model": "espeak", "input": "hi \\ud800", "voice": "\\udfff"}'
                  if path == "/ws/v1/tts" else '{"model": "espeak", "voice": "\\ud800"}')
        frames, code = read_all(conn)
    assert code == 1000
    assert assert_openai_error({"error": frames[-1]["error"]})["type"] == "invalid_request_error"
    assert_clean(live)


def test_no_first_message_closes_with_1008(live: LiveServer) -> None:
    started = time.monotonic()
    with ws(live, "/ws/v1/tts/text") as conn:
        frames, code = read_all(conn)
    assert code == 1008
    assert assert_openai_error({"error": frames[-1]["error"]})["code"] == "timeout"
    assert time.monotonic() - started < 10
    assert_clean(live)


# -- endless text --------------------------------------------------------------------------------

def test_endless_text_without_terminators_is_cut_and_the_session_keeps_working(
    live: LiveServer,
) -> None:
    limit = live.app.state.service.registry["espeak"].engine.capabilities.max_segment_chars
    words = " ".join(f"word{i}" for i in range(90))  # ~600 characters, no sentence end
    segments: list[dict[str, Any]] = []
    with ws(live, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "espeak"}))
        assert json.loads(conn.recv(timeout=30))["type"] == "started"
        for _ in range(4):
            conn.send(json.dumps({"text": words + " "}))
        while len(segments) < 3:
            message = conn.recv(timeout=30)
            if isinstance(message, str) and json.loads(message)["type"] == "segment":
                segments.append(json.loads(message))
        conn.send(json.dumps({"type": "cancel"}))
        frames, code = read_all(conn)
    assert all(0 < len(s["text"]) <= limit for s in segments)
    assert segments[0]["text"].startswith("word0 word1")
    assert json_frames(frames)[-1]["type"] == "cancelled" and code == 1000
    assert_clean(live)


def test_endless_text_with_nothing_to_say_stays_bounded(live: LiveServer) -> None:
    """Punctuation is carried into the next sentence, but never more than one segment of it."""
    limit = live.app.state.service.registry["espeak"].engine.capabilities.max_segment_chars
    with ws(live, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "espeak"}))
        assert json.loads(conn.recv(timeout=30))["type"] == "started"
        for _ in range(8):
            conn.send(json.dumps({"text": "-- " * 330}))  # ~1000 characters, nothing to say
        conn.send(json.dumps({"type": "end", "text": "And then a real sentence at last."}))
        frames, code = read_all(conn)
    final = json_frames(frames)[-1]
    assert final["type"] == "done" and code == 1000, final
    spoken = [f for f in json_frames(frames) if f["type"] == "segment"]
    assert spoken and all(len(s["text"]) <= limit for s in spoken)
    assert spoken[-1]["text"].endswith("And then a real sentence at last.")
    assert_clean(live)


def test_text_backlog_over_the_limit_closes_with_1008(live: LiveServer) -> None:
    """Text arriving faster than it is spoken may wait up to `ws_max_pending_chars`."""
    with ws(live, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": MODEL}))
        assert json.loads(conn.recv(timeout=30))["type"] == "started"
        conn.send(json.dumps({"text": "SLOW first sentence here. "}))
        try:
            for i in range(10):  # sent while the first sentence takes its time
                conn.send(json.dumps({"text": f"Sentence {i} goes on for a while. " * 15}))
        except ConnectionClosed:
            pass  # the server may close before a flooding client has sent everything
        frames, code = read_all(conn)
    assert code == 1008
    error = assert_openai_error({"error": json_frames(frames)[-1]["error"]})
    assert error["code"] == "text_backlog_full"
    assert_clean(live)


# -- a reader that never reads -------------------------------------------------------------------

def test_a_client_that_never_reads_holds_no_engine(live: LiveServer) -> None:
    """While the client reads nothing, synthesis runs ahead of it by the stream buffer, then
    waits holding no place and no lease; all of the audio arrives once it reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", int(live.url.rsplit(":", 1)[1])))
    text = story(55)  # ~3,000 characters: minutes of audio, far more than the socket buffers
    with ws(live, sock=sock, max_queue=1) as conn:
        conn.send(json.dumps({"model": "espeak", "input": text}))
        time.sleep(0.5)
        assert wait_until(lambda: idle_state(live), WAITING) == WAITING
        assert gate_open(live) == 1  # the session is still there, stuck on sending
        frames, code = read_all(conn)
    assert code == 1000
    done = json_frames(frames)[-1]
    assert done["type"] == "done"
    audio = b"".join(f for f in frames if isinstance(f, bytes))
    received_ms = len(audio) / 2 / ESPEAK_RATE * 1000
    assert received_ms == pytest.approx(done["stats"]["audio_duration_ms"], abs=1)
    assert received_ms > 60_000
    assert_clean(live)


def test_a_client_that_never_reads_at_all_loses_its_session_after_the_send_timeout(
    live: LiveServer,
) -> None:
    """A bare socket that completes the handshake, sends its request, then reads nothing."""
    port = int(live.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    request_id = f"never-reads-{uuid.uuid4().hex[:8]}"
    try:
        sock.sendall(_handshake(port, complete=True, request_id=request_id))
        response = b""
        while b"\r\n\r\n" not in response:  # a client must await the 101 before sending
            response += sock.recv(1)
        assert response.startswith(b"HTTP/1.1 101")
        sock.sendall(_masked_text(json.dumps({"model": "espeak", "input": story(55)})))
        # Some audio made, then the job waits for the reader, holding nothing.
        assert wait_until(lambda: request_status(live, request_id), "streaming") == "streaming"
        assert wait_until(lambda: idle_state(live), WAITING) == WAITING
        assert request_status(live, request_id) == "streaming"
        assert gate_open(live) == 1  # while the session is stuck sending
        started = time.monotonic()
        # The session gives up on the client, freeing its connection place.
        assert wait_until(lambda: gate_open(live), 0, timeout=SEND_TIMEOUT + 15) == 0
        assert time.monotonic() - started < SEND_TIMEOUT + 15
    finally:
        hang_up(sock)
    assert_clean(live)


def request_status(live: LiveServer, request_id: str) -> str | None:
    rows = live.app.state.service.stats.requests(lambda record: None)
    return next((str(r["status"]) for r in rows if r["id"] == request_id), None)


def _masked_text(text: str) -> bytes:
    """One client-to-server text frame (masked, as RFC 6455 requires), payload under 64 KiB."""
    payload = text.encode()
    mask = b"\x01\x02\x03\x04"
    masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
    return bytes([0x81, 0x80 | 126]) + len(payload).to_bytes(2, "big") + mask + masked


# -- clients that vanish -------------------------------------------------------------------------

def _handshake(port: int, complete: bool, request_id: str = "stalled-handshake") -> bytes:
    lines = [
        "GET /ws/v1/tts HTTP/1.1", f"Host: 127.0.0.1:{port}", "Upgrade: websocket",
        "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13", f"X-Request-ID: {request_id}",
    ]
    return ("\r\n".join(lines) + ("\r\n\r\n" if complete else "\r\n")).encode()


@pytest.mark.parametrize("complete", [False, True])
def test_client_that_disconnects_mid_handshake(
    live: LiveServer, complete: bool, caplog: pytest.LogCaptureFixture
) -> None:
    port = int(live.url.rsplit(":", 1)[1])
    with caplog.at_level(logging.ERROR):
        for _ in range(10):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(_handshake(port, complete))
            hang_up(sock)
        assert_clean(live)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_client_that_vanishes_after_its_request_frees_everything(live: LiveServer) -> None:
    for _ in range(5):
        with ws(live) as conn:
            conn.send(json.dumps({"model": "espeak", "input": story(30)}))
            conn.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET)
            conn.socket.shutdown(socket.SHUT_RDWR)
    assert_clean(live)
