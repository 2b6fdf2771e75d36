"""DNS rebinding: a page on another name that resolves to 127.0.0.1 reaches a loopback-bound
server with that name in `Host`. Such a server answers only loopback names unless
`VOXMUX_ALLOWED_HOSTS` says more (app.http.hosts); HTTP and WebSocket upgrades alike."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from pydantic import ValidationError
from websockets.sync.client import connect

from app.settings import Settings
from tests.conftest import LiveServer, start_server, test_settings
from tests.reliability.checks import assert_openai_error

REBIND = "rebind.example"


@pytest.fixture(scope="module")
def loopback(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("hosts"), preload=["espeak"]))
    yield live
    live.stop()


def port(server: LiveServer) -> int:
    return int(server.url.rsplit(":", 1)[1])


def get(server: LiveServer, host: str, path: str = "/v1/models") -> httpx.Response:
    return httpx.get(server.url + path, headers={"Host": host}, timeout=30)


def upgrade(server: LiveServer, host: str) -> tuple[int, bytes]:
    """A WebSocket handshake for /ws/v1/tts with `host` in `Host`: (status, body)."""
    request = (f"GET /ws/v1/tts HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port(server)), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return status, body


def assert_host_refused(status: int, body: bytes) -> None:
    assert status == 400, body
    error = assert_openai_error(json.loads(body), status=400)
    assert error["code"] == "host_not_allowed" and REBIND in error["message"]
    assert "VOXMUX_ALLOWED_HOSTS" in error["message"]


def test_a_rebound_name_is_refused_on_http_and_websocket(loopback: LiveServer) -> None:
    for host in (REBIND, f"{REBIND}:{port(loopback)}"):
        for path in ("/v1/models", "/health", "/"):
            answer = get(loopback, host, path)
            assert_host_refused(answer.status_code, answer.content)
    posted = httpx.post(loopback.url + "/v1/audio/speech", headers={"Host": REBIND},
                        json={"model": "espeak", "input": "Hello."}, timeout=30)
    assert_host_refused(posted.status_code, posted.content)
    assert_host_refused(*upgrade(loopback, f"{REBIND}:{port(loopback)}"))


@pytest.mark.parametrize("host", ["localhost", "localhost:{port}", "LOCALHOST:{port}",
                                  "127.0.0.1", "127.0.0.1:{port}", "127.1.2.3:{port}",
                                  "[::1]", "[::1]:{port}"])
def test_loopback_names_are_served(loopback: LiveServer, host: str) -> None:
    host = host.format(port=port(loopback))
    assert get(loopback, host).status_code == 200
    assert upgrade(loopback, host)[0] == 101


def test_a_websocket_client_on_localhost_speaks(loopback: LiveServer) -> None:
    url = f"ws://localhost:{port(loopback)}/ws/v1/tts"
    with connect(url, proxy=None, open_timeout=30) as ws:
        ws.send(json.dumps({"model": "espeak", "input": "Hello there."}))
        kinds = [json.loads(m)["type"] for m in ws if isinstance(m, str)]
    assert kinds[-1] == "done"


def test_allowed_hosts_admit_a_named_host(tmp_path_factory: pytest.TempPathFactory) -> None:
    live = start_server(test_settings(tmp_path_factory.mktemp("named"), preload=[],
                                      allowed_hosts="voxmux.example, Speech.Example"))
    try:
        assert get(live, "voxmux.example").status_code == 200
        assert get(live, f"speech.example:{port(live)}").status_code == 200
        assert upgrade(live, "voxmux.example")[0] == 101
        assert get(live, f"localhost:{port(live)}").status_code == 200  # loopback stays served
        assert_host_refused(*(lambda a: (a.status_code, a.content))(get(live, REBIND)))
        assert_host_refused(*upgrade(live, REBIND))
    finally:
        live.stop()


def test_a_wildcard_admits_any_host(tmp_path_factory: pytest.TempPathFactory) -> None:
    live = start_server(test_settings(tmp_path_factory.mktemp("any"), preload=[],
                                      allowed_hosts="*"))
    try:
        assert get(live, REBIND).status_code == 200
        assert upgrade(live, REBIND)[0] == 101
    finally:
        live.stop()


def test_a_server_bound_beyond_loopback_keeps_any_host_unless_told(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """`VOXMUX_HOST=0.0.0.0` (as in docker): names are not checked unless the setting is set."""
    live = start_server(test_settings(tmp_path_factory.mktemp("wide"), preload=[],
                                      host="0.0.0.0"))
    try:
        assert get(live, REBIND).status_code == 200
    finally:
        live.stop()
    live = start_server(test_settings(tmp_path_factory.mktemp("wide-named"), preload=[],
                                      host="0.0.0.0", allowed_hosts="voxmux.example"))
    try:
        assert get(live, "voxmux.example").status_code == 200
        assert get(live, "127.0.0.1").status_code == 200
        answer = get(live, REBIND)
        assert_host_refused(answer.status_code, answer.content)
    finally:
        live.stop()


def test_allowed_hosts_are_names_not_urls() -> None:
    with pytest.raises(ValidationError, match="not a host name"):
        Settings(allowed_hosts="https://voxmux.example")
