"""Clients that hold connections without finishing requests, too many connections, bytes that
are not HTTP, bad WebSocket text: each is bounded or refused in OpenAI's error shape
(app.http.connections, app.http.limits.BodyTimeout).

The timeouts are set short here; an assert on elapsed time only checks that the configured
timeout, not something else, ended the connection (generous upper bounds, shared machine).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import routing
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from app.routes.elevenlabs import ROOT_PATHS
from tests.conftest import LiveServer, start_server, test_settings
from tests.reliability.checks import IDLE, assert_openai_error, idle_state, wait_until

TIMEOUT = 2.0
SLACK = 10.0


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("strict"), preload=["espeak"],
                                      header_timeout=TIMEOUT, body_timeout=TIMEOUT,
                                      http_send_timeout=TIMEOUT, keepalive_timeout=1))
    yield live
    live.stop()


def address(server: LiveServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@dataclass
class Answer:
    raw: bytes
    elapsed: float
    """Seconds from the last byte sent to the server's close."""

    @property
    def status(self) -> int:
        return int(self.raw.split(b" ", 2)[1]) if self.raw else 0

    @property
    def headers(self) -> dict[str, str]:
        head = self.raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
        return {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in head)}

    @property
    def error(self) -> dict[str, object]:
        assert self.headers["content-type"] == "application/json", self.raw
        return assert_openai_error(json.loads(self.raw.split(b"\r\n\r\n", 1)[1]))


def exchange(server: LiveServer, data: bytes, *, drip: float = 0) -> Answer:
    """Send `data` (one byte per `drip` seconds if set) and read until the server closes."""
    sock = socket.create_connection(address(server), timeout=60)
    received = bytearray()

    def read() -> None:
        try:
            while chunk := sock.recv(65536):
                received.extend(chunk)
        except OSError:
            pass

    reader = threading.Thread(target=read)
    reader.start()
    try:
        if drip:
            for byte in data:
                if not reader.is_alive():
                    break
                sock.send(bytes([byte]))
                time.sleep(drip)
        else:
            sock.sendall(data)
    except OSError:  # the server closed while we were still sending
        pass
    sent = time.monotonic()
    reader.join(timeout=60)
    elapsed = time.monotonic() - sent
    sock.close()
    assert not reader.is_alive(), "the server never closed the connection"
    return Answer(bytes(received), elapsed)


def test_a_stalled_body_is_closed_within_the_body_timeout(strict: LiveServer) -> None:
    head = (b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n")
    short = exchange(strict, head + b"Content-Length: 100\r\n\r\n" + b'{"model": "esp')
    chunked = exchange(strict, head + b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n")
    for answer in (short, chunked):
        assert answer.status == 408, answer.raw
        assert answer.error["code"] == "client_too_slow"
        assert answer.headers["connection"] == "close" and answer.headers["x-request-id"]
        assert TIMEOUT * 0.8 < answer.elapsed < TIMEOUT + SLACK


def test_an_unfinished_head_is_closed_within_the_header_timeout(strict: LiveServer) -> None:
    begun = exchange(strict, b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
    assert begun.status == 408 and begun.error["code"] == "client_too_slow"
    assert TIMEOUT * 0.8 < begun.elapsed < TIMEOUT + SLACK
    silent = exchange(strict, b"")
    assert silent.raw == b"" and TIMEOUT * 0.8 < silent.elapsed < TIMEOUT + SLACK
    # Bytes that keep coming do not extend it: the whole head has the timeout, not each byte.
    dripped = exchange(strict, b"GET /health HTTP/1.1\r\nX-Slow: " + b"a" * 200, drip=0.1)
    assert dripped.status == 408


def test_an_idle_keepalive_connection_is_closed(strict: LiveServer) -> None:
    answer = exchange(strict, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert answer.status == 200
    assert answer.elapsed < 1 + SLACK  # VOXMUX_KEEPALIVE_TIMEOUT=1


def test_a_client_that_stops_reading_is_dropped(strict: LiveServer) -> None:
    """A streamed response nobody reads: the connection is dropped after the send timeout and
    the request ends as if the client had hung up."""
    text = "A client asked for this and then stopped listening to the answer. " * 50
    body = json.dumps({"model": "espeak", "input": text, "response_format": "pcm"}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills at once
    sock.settimeout(60)
    sock.connect(address(strict))
    sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    time.sleep(TIMEOUT + 3)  # reading nothing
    received = bytearray()
    try:
        while chunk := sock.recv(65536):
            received.extend(chunk)
    except ConnectionResetError:
        pass
    finally:
        sock.close()
    assert received.startswith(b"HTTP/1.1 200")
    assert not received.endswith(b"0\r\n\r\n"), "the whole response arrived: nothing stalled"
    assert wait_until(lambda: idle_state(strict), IDLE) == IDLE
    assert len(received) < 2 * 24000 * len(text) / 15  # far less than the speech asked for


WS_UPGRADE = (b"GET /ws/v1/tts HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
              b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
              b"Sec-WebSocket-Version: 13\r\n")


@pytest.mark.parametrize(("request_bytes", "status", "code"), [
    (b"GET /health?" + b"q" * (2 << 20) + b" HTTP/1.1\r\nHost: localhost\r\n\r\n", 414,
     "url_too_long"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n", 431,
     "request_head_too_large"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-A: a\rb\r\n\r\n", 400, "malformed_request"),
    (b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-A: a\nb\r\n\r\n", 400, "malformed_request"),
    (b"NOT HTTP AT ALL\r\n\r\n", 400, "malformed_request"),
    (b"GET /ws/v1/tts HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
     b"Sec-WebSocket-Version: 13\r\n\r\n", 400, "malformed_request"),
    # Under the server's head limit but over websockets' own (8 KiB a line): uvicorn before 0.55
    # left such an upgrade unanswered.
    (WS_UPGRADE + b"X-Big: " + b"a" * 10000 + b"\r\n\r\n", 431, "request_head_too_large"),
], ids=["2 MB query", "70 KB header", "bare CR", "bare LF", "not HTTP", "WebSocket without key",
        "WebSocket 10 KB header"])
def test_requests_the_parser_refuses_get_the_error_shape(
    strict: LiveServer, request_bytes: bytes, status: int, code: str
) -> None:
    answer = exchange(strict, request_bytes)
    assert answer.status == status, answer.raw[:300]
    assert answer.error["code"] == code
    assert answer.headers["connection"] == "close" and answer.headers["x-request-id"]
    assert answer.headers["x-content-type-options"] == "nosniff"


ELEVENLABS_PATHS = ("/elevenlabs/", *ROOT_PATHS)


def test_options_names_the_methods_a_path_takes(server: LiveServer) -> None:
    expected: dict[str, set[str]] = {}
    for route in routing.iter_route_contexts(server.app.routes):
        if isinstance(route.original_route, routing.APIRoute) and "{" not in route.path_format:
            expected.setdefault(route.path_format, set()).update(route.methods or ())
    assert expected["/v1/models/switch"] == {"POST"}
    with server.client() as client:
        for path, methods in expected.items():
            response = client.options(path)
            assert response.status_code == 405, path
            allowed = {m.strip() for m in response.headers["allow"].split(",")}
            assert allowed == methods, path
            if path.startswith(ELEVENLABS_PATHS):  # ElevenLabs' routes answer in its shape
                assert set(response.json()["detail"]) == {"status", "message"}, path
            else:
                assert_openai_error(response.json())


# -- many connections ----------------------------------------------------------------------------


def idle_sockets(server: LiveServer, count: int) -> list[socket.socket]:
    return [socket.create_connection(address(server), timeout=60) for _ in range(count)]


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The default connection cap, and idle sockets left alone for the test's length."""
    live = start_server(test_settings(tmp_path_factory.mktemp("patient"), preload=["espeak"],
                                      header_timeout=60))
    yield live
    live.stop()


def test_200_idle_sockets_do_not_stop_new_clients(patient: LiveServer) -> None:
    idle = idle_sockets(patient, 200)
    try:
        with patient.client() as client:
            assert client.get("/health").status_code == 200
            speech = client.post("/v1/audio/speech", json={
                "model": "espeak", "input": "Still here.", "response_format": "wav"})
        assert speech.status_code == 200 and len(speech.content) > 1000
    finally:
        for sock in idle:
            sock.close()


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("capped"), preload=["espeak"],
                                      max_connections=20, header_timeout=3))
    yield live
    live.stop()


def test_over_the_cap_new_clients_are_refused_cleanly_then_served(capped: LiveServer) -> None:
    idle = idle_sockets(capped, 200)
    try:
        refused = httpx.get(capped.url + "/health", timeout=30)
        assert refused.status_code == 503
        assert assert_openai_error(refused.json())["code"] == "too_many_connections"
        assert refused.headers["retry-after"] == "1" and refused.headers["x-request-id"]
        ws_url = capped.url.replace("http://", "ws://", 1) + "/ws/v1/tts"
        with connect(ws_url, proxy=None, open_timeout=30) as ws, \
                pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        # The idle sockets never send a request: the header timeout closes every one of them,
        # and new clients are served again.
        deadline = time.monotonic() + 3 + SLACK
        while time.monotonic() < deadline:
            if httpx.get(capped.url + "/health", timeout=30).status_code == 200:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("new clients were still refused after the header timeout")
        assert all(closed_by_server(sock) for sock in idle)
    finally:
        for sock in idle:
            sock.close()


# -- WebSocket text that is not UTF-8 ------------------------------------------------------------


def test_a_flood_of_invalid_utf8_frames_leaves_no_traceback(
    strict: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = strict.url.replace("http://", "ws://", 1) + "/ws/v1/tts"
    codes = []
    for index in range(40):
        with connect(url, proxy=None, open_timeout=30) as ws:
            with ws.protocol_mutex:  # below the client's own UTF-8 check
                if index % 2:
                    ws.protocol.send_text(b"\xff\xfe", fin=False)
                    ws.protocol.send_continuation(b"\x80", fin=True)
                else:
                    ws.protocol.send_text(b'{"input": "\xc3\x28"}')
                ws.send_data()
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            codes.append(closed.value.rcvd.code if closed.value.rcvd else None)
    assert codes == [1007] * 40
    server_side = [r for r in caplog.records if not r.name.startswith("websockets.client")]
    assert not [r for r in server_side if r.exc_info], "a traceback was logged"
    text = "\n".join(r.getMessage() for r in server_side)
    assert "Traceback" not in text and "UnicodeDecodeError" not in text
    with connect(url, proxy=None, open_timeout=30) as ws:  # and the server still speaks
        ws.send(json.dumps({"model": "espeak", "input": "Fine."}))
        frames = [json.loads(m)["type"] for m in ws if isinstance(m, str)]
    assert frames[-1] == "done"
