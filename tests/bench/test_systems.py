"""The benchmark's HTTP load generator: real audio from a live server, reconnects, errors."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.systems import VoxMuxClient
from tests.conftest import LiveServer

RATE = 24_000
BODY = b"\x01\x00" * RATE  # one second of s16le


class _ClosingHandler(BaseHTTPRequestHandler):
    """Answers HTTP/1.1 without `Connection: close`, then drops the connection, as a server
    does to a keep-alive connection that sat idle past its timeout."""

    protocol_version = "HTTP/1.1"
    status = 200

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        body = BODY if self.status == 200 else b'{"error": {"message": "busy"}}'
        self.send_response(self.status)
        self.send_header("content-length", str(len(body)))
        self.send_header("x-sample-rate", str(RATE))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class _ClosingServer(ThreadingHTTPServer):
    closed: threading.Semaphore
    """Released each time a connection has been shut down."""

    def shutdown_request(self, request: object) -> None:
        super().shutdown_request(request)  # type: ignore[arg-type]
        self.closed.release()


@pytest.fixture
def closing_server() -> Iterator[tuple[_ClosingServer, type[_ClosingHandler]]]:
    handler = type("Handler", (_ClosingHandler,), {})
    httpd = _ClosingServer(("127.0.0.1", 0), handler)
    httpd.closed = threading.Semaphore(0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd, handler
    httpd.shutdown()
    httpd.server_close()


def test_voxmux_client_reads_the_whole_stream_of_a_live_server(server: LiveServer) -> None:
    client = VoxMuxClient(server.url, model="espeak")
    try:
        sample = client.request("The harness reads every byte of this sentence.")
        again = client.request("And the same connection serves a second request.")
    finally:
        client.close()
    # A streamed espeak sentence lasts one to five seconds; the first bytes come before the last.
    for one in (sample, again):
        assert 1.0 < one.audio_s < 5.0
        assert 0 < one.ttfa <= one.total


def test_a_connection_the_server_dropped_is_replaced(
    closing_server: tuple[_ClosingServer, type[_ClosingHandler]],
) -> None:
    httpd, _ = closing_server
    client = VoxMuxClient(f"http://127.0.0.1:{httpd.server_address[1]}")
    samples = []
    try:
        for text in ("one", "two", "three"):
            samples.append(client.request(text))
            # The server has dropped the connection (idle past its keep-alive timeout) before
            # the next request is sent on it.
            assert httpd.closed.acquire(timeout=10)
    finally:
        client.close()
    assert [s.audio_s for s in samples] == [1.0, 1.0, 1.0]


def test_an_error_status_fails_the_request_with_the_body(
    closing_server: tuple[_ClosingServer, type[_ClosingHandler]],
) -> None:
    httpd, handler = closing_server
    handler.status = 503
    client = VoxMuxClient(f"http://127.0.0.1:{httpd.server_address[1]}")
    try:
        with pytest.raises(RuntimeError, match=r"503.*busy"):
            client.request("one")
    finally:
        client.close()


class _KeepAliveHandler(_ClosingHandler):
    """Sized bodies on a connection that stays open (kokoro-onnx's benchmark server does this)."""

    def do_POST(self) -> None:
        super().do_POST()
        self.close_connection = False


def test_sized_bodies_on_one_kept_alive_connection() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _KeepAliveHandler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    client = VoxMuxClient(f"http://127.0.0.1:{httpd.server_address[1]}")
    try:
        samples = [client.request(text) for text in ("one", "two", "three")]
    finally:
        client.close()
        httpd.shutdown()
        httpd.server_close()
    assert [s.audio_s for s in samples] == [1.0, 1.0, 1.0]
