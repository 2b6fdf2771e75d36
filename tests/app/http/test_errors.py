"""Bad input gets OpenAI's error shape with the right status, type and param; never a 500."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer, start_server, test_settings

GOOD = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}

CASES: list[tuple[str, Any, int, str, str | None]] = [
    ("empty input", {**GOOD, "input": ""}, 400, "invalid_request_error", "input"),
    ("blank input", {**GOOD, "input": "   "}, 400, "invalid_request_error", "input"),
    ("over-long input", {**GOOD, "input": "a" * 4097}, 400, "invalid_request_error", "input"),
    ("unknown model", {**GOOD, "model": "tts-9"}, 404, "invalid_request_error", "model"),
    ("unknown voice", {**GOOD, "voice": "nobody"}, 400, "invalid_request_error", "voice"),
    ("unknown blend part", {**GOOD, "model": "kokoro", "voice": "jf_alpha+nobody"}, 400,
     "invalid_request_error", "voice"),
    ("speed too low", {**GOOD, "speed": 0.1}, 400, "invalid_request_error", "speed"),
    ("speed too high", {**GOOD, "speed": 4.5}, 400, "invalid_request_error", "speed"),
    ("speed as text", {**GOOD, "speed": "fast"}, 400, "invalid_request_error", "speed"),
    ("unknown format", {**GOOD, "response_format": "ogg"}, 400, "invalid_request_error",
     "response_format"),
    ("unknown stream format", {**GOOD, "stream_format": "ws"}, 400, "invalid_request_error",
     "stream_format"),
    ("input as number", {**GOOD, "input": 42}, 400, "invalid_request_error", "input"),
    ("voice as list", {**GOOD, "voice": ["alloy"]}, 400, "invalid_request_error", "voice"),
    ("missing model", {"input": "Hello."}, 400, "invalid_request_error", "model"),
    ("missing input", {"model": "tts-1"}, 400, "invalid_request_error", "input"),
    ("unknown field", {**GOOD, "temperature": 0.5}, 400, "invalid_request_error", "temperature"),
    ("body is a list", [GOOD], 400, "invalid_request_error", None),
    ("nothing speakable", {**GOOD, "input": "..."}, 400, "invalid_request_error", "input"),
]


@pytest.mark.parametrize(("body", "status", "kind", "param"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_speech_request(server: LiveServer, body: Any, status: int, kind: str,
                            param: str | None) -> None:
    with server.client() as http:
        response = http.post("/v1/audio/speech", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind
    assert error["param"] == param
    assert error["message"]
    assert response.headers["x-request-id"]


def test_malformed_json(server: LiveServer) -> None:
    with server.client() as http:
        response = http.post("/v1/audio/speech", content=b'{"model": "tts-1", "input": ',
                             headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert "JSON" in response.json()["error"]["message"]


def test_unknown_route_and_model_lookup(server: LiveServer) -> None:
    with server.client() as http:
        missing_route = http.get("/v1/nowhere")
        missing_model = http.get("/v1/models/nope")
        voices = http.get("/v1/audio/voices", params={"model": "nope"})
    assert missing_route.status_code == 404
    assert missing_route.json()["error"]["type"] == "invalid_request_error"
    assert missing_model.status_code == voices.status_code == 404
    assert missing_model.json()["error"]["param"] == "model"


def test_an_unhandled_error_is_a_500_that_keeps_the_connection(tmp_path: Path) -> None:
    """A bug's 500 has the error shape and the request id, and the kept-alive connection it
    came on serves the next request (it used to be dropped without `Connection: close`, so a
    client's next request on it failed with a reset)."""
    live = start_server(test_settings(tmp_path, preload=[]))

    async def broken() -> None:
        raise RuntimeError("a bug")

    live.app.add_api_route("/boom", broken)
    try:
        port = int(live.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            reader = sock.makefile("rb")
            head, body = _exchange(sock, reader, "/boom")
            time.sleep(0.3)  # a dropped connection shows as EOF or a reset from here on
            again, _ = _exchange(sock, reader, "/health")
    finally:
        live.stop()
    assert head[0].startswith(b"HTTP/1.1 500"), head
    assert b"x-request-id" in b"".join(head).lower()
    error = json.loads(body)["error"]
    assert error["type"] == "server_error" and "a bug" not in error["message"]
    assert again and again[0].startswith(b"HTTP/1.1 200"), again


def _exchange(sock: socket.socket, reader: Any, path: str) -> tuple[list[bytes], bytes]:
    """One keep-alive GET on `sock`: the response's head lines and its body."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head: list[bytes] = []
    while (line := reader.readline()) not in (b"\r\n", b""):
        head.append(line)
    length = next((int(h.split(b":")[1]) for h in head
                   if h.lower().startswith(b"content-length")), 0)
    return head, reader.read(length)
