"""API keys: every protected route, every way to present a key, and keys never leaking."""

from __future__ import annotations

import json
import logging
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from app.http.auth import COOKIE, Authenticator, RedactTokens
from app.main import create_app
from tests.conftest import LiveServer, start_server, test_settings

KEY = "vmx-test-" + secrets.token_hex(16)
SECOND = "vmx-second-" + secrets.token_hex(16)
WRONG = "vmx-wrong-" + secrets.token_hex(16)
SPEAK = {"model": "espeak", "input": "Keys keep strangers out.", "response_format": "pcm"}

Route = tuple[str, str, dict[str, Any] | None, int]
"""method, path, JSON body, status when authorized."""

ADMIN: list[Route] = [
    ("GET", "/stats", None, 200),
    ("GET", "/requests", None, 200),
    ("POST", "/v1/models/espeak/load", None, 200),
    ("POST", "/v1/models/switch", {"model": "espeak", "unload_previous": False}, 200),
    ("POST", "/v1/models/piper/unload", None, 200),
    ("POST", "/v1/models/rescan", None, 200),
    # Knowing a request id is not enough to stop someone else's request.
    ("POST", "/v1/audio/requests/no-such-request/cancel", None, 404),
]
SYNTHESIS: list[Route] = [
    ("POST", "/v1/audio/speech", SPEAK, 200),
    ("POST", "/v1/audio/speech", SPEAK | {"stream_format": "sse"}, 200),
    ("POST", "/v1/synth", {"model": "espeak", "input": "Keys keep strangers out."}, 200),
    ("GET", "/api/tts?model=espeak&text=Keys+keep+strangers+out.", None, 200),
    ("GET", "/v1/models", None, 200),
    ("GET", "/v1/models/espeak", None, 200),
    ("GET", "/v1/audio/voices?model=espeak", None, 200),
    ("GET", "/metrics", None, 200),
]
OPEN: list[Route] = [
    ("GET", "/health", None, 200),
    ("GET", "/v1/auth/session", None, 200),
]


def route_id(route: Route) -> str:
    body = route[2] or {}
    return f"{route[0]} {route[1].split('?')[0]}{' sse' if 'stream_format' in body else ''}"


def server_for(tmp: Path, scope: str) -> LiveServer:
    return start_server(test_settings(tmp, preload=[], api_keys=f"{KEY},{SECOND}",
                                      auth_scope=scope))


@pytest.fixture(scope="module")
def admin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = server_for(tmp_path_factory.mktemp("auth-admin"), "admin")
    yield live
    live.stop()


@pytest.fixture(scope="module")
def all_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = server_for(tmp_path_factory.mktemp("auth-all"), "all")
    yield live
    live.stop()


@pytest.fixture(autouse=True)
def no_key_in_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    for key in (KEY, SECOND, WRONG):
        assert key not in caplog.text


def call(server: LiveServer, route: Route, headers: dict[str, str] | None = None
         ) -> httpx.Response:
    method, path, body, _ = route
    with server.client() as http:
        response = http.request(method, path, json=body, headers=headers)
    leaked = response.text + json.dumps(dict(response.headers))
    for key in (KEY, SECOND, WRONG):
        assert key not in leaked
    return response


def assert_refused(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["message"].startswith("Incorrect API key provided")
    assert error["type"] == "invalid_request_error"
    assert error["param"] is None and error["code"] == "invalid_api_key"


def session_cookie(server: LiveServer, key: str = KEY) -> str:
    with server.client() as http:
        response = http.post("/v1/auth/session", json={"key": key})
    assert response.status_code == 200, response.text
    header = response.headers["set-cookie"]
    assert "httponly" in header.lower() and "samesite=strict" in header.lower()
    assert key not in header
    return response.cookies[COOKIE]


def ways_in(server: LiveServer) -> dict[str, dict[str, str]]:
    return {
        "bearer": {"Authorization": f"Bearer {KEY}"},
        "second key": {"Authorization": f"Bearer {SECOND}"},
        # The cookie is a browser's: it comes with the page's own Origin (app.http.origin).
        "cookie": {"Cookie": f"{COOKIE}={session_cookie(server)}", "Origin": server.url},
    }


@pytest.mark.parametrize("route", ADMIN, ids=route_id)
def test_admin_routes_need_a_key_under_admin_scope(admin_server: LiveServer,
                                                   route: Route) -> None:
    assert_refused(call(admin_server, route))
    assert_refused(call(admin_server, route, {"Authorization": f"Bearer {WRONG}"}))
    assert_refused(call(admin_server, route, {"Authorization": KEY}))  # no Bearer scheme
    assert_refused(call(admin_server, route, {"Cookie": f"{COOKIE}=forged.1999999999.00"}))
    for way, headers in ways_in(admin_server).items():
        assert call(admin_server, route, headers).status_code == route[3], way


@pytest.mark.parametrize("route", SYNTHESIS + OPEN, ids=route_id)
def test_admin_scope_leaves_synthesis_open(admin_server: LiveServer, route: Route) -> None:
    assert call(admin_server, route).status_code == route[3]


@pytest.mark.parametrize("route", ADMIN + SYNTHESIS, ids=route_id)
def test_all_scope_guards_every_route(all_server: LiveServer, route: Route) -> None:
    assert_refused(call(all_server, route))
    assert_refused(call(all_server, route, {"Authorization": f"Bearer {WRONG}"}))
    for way, headers in ways_in(all_server).items():
        assert call(all_server, route, headers).status_code == route[3], way


@pytest.mark.parametrize("route", OPEN, ids=route_id)
def test_health_and_session_state_stay_open(all_server: LiveServer, route: Route) -> None:
    assert call(all_server, route).status_code == 200


def ws_url(server: LiveServer, path: str, query: str = "") -> str:
    return server.url.replace("http://", "ws://", 1) + path + query


def speak_over_ws(url: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    with connect(url, additional_headers=headers, proxy=None, open_timeout=30) as ws:
        ws.send(json.dumps({"model": "espeak", "input": "Tokens open sockets."}))
        for message in ws:
            if isinstance(message, str):
                frame: dict[str, Any] = json.loads(message)
                if frame["type"] in ("done", "error", "cancelled"):
                    return frame
    raise AssertionError("no final frame")


@pytest.mark.parametrize("path", ["/ws/v1/tts", "/ws/v1/tts/text"])
@pytest.mark.parametrize("query", ["", f"?token={WRONG}"], ids=["no token", "wrong token"])
def test_websocket_without_a_good_key_is_closed_with_1008(all_server: LiveServer, path: str,
                                                          query: str) -> None:
    url = ws_url(all_server, path, query)
    with connect(url, proxy=None, open_timeout=30) as ws, pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008


def test_websocket_accepts_token_bearer_and_cookie(all_server: LiveServer) -> None:
    url = ws_url(all_server, "/ws/v1/tts")
    assert speak_over_ws(url + f"?token={KEY}")["type"] == "done"
    assert speak_over_ws(url, {"Authorization": f"Bearer {SECOND}"})["type"] == "done"
    cookie = session_cookie(all_server)
    browser = {"Cookie": f"{COOKIE}={cookie}", "Origin": all_server.url}
    assert speak_over_ws(url, browser)["type"] == "done"


def test_session_login_errors_and_logout(all_server: LiveServer) -> None:
    with all_server.client() as http:
        refused = http.post("/v1/auth/session", json={"key": WRONG})
        assert WRONG not in refused.text
        assert_refused(refused)
        state = http.get("/v1/auth/session").json()
        assert state == {"auth_required": True, "scope": "all", "authenticated": False}
    cookie = session_cookie(all_server)
    jar = {"Cookie": f"{COOKIE}={cookie}", "Origin": all_server.url}
    assert call(all_server, ADMIN[0], jar).status_code == 200
    with all_server.client() as http:
        assert http.get("/v1/auth/session", headers=jar).json()["authenticated"] is True
        logout = http.delete("/v1/auth/session", headers=jar)
    assert logout.status_code == 200 and COOKIE in logout.headers["set-cookie"]
    assert_refused(call(all_server, ADMIN[0], jar))  # a copy kept by someone is dead too


def test_sessions_end_when_the_key_rotates_or_expires() -> None:
    old = Authenticator((KEY,), "admin", 3600)
    cookie, _ = old.open_session(KEY)
    assert old.session_valid(cookie)
    assert not Authenticator((SECOND,), "admin", 3600).session_valid(cookie)
    nonce, expires, signature = cookie.split(".")
    assert not old.session_valid(f"{nonce}.{int(expires) + 60}.{signature}")
    expired, _ = Authenticator((KEY,), "admin", -1).open_session(KEY)
    assert not old.session_valid(expired)


def test_auto_key_is_written_once_0600_and_reused(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    settings = test_settings(tmp_path, preload=[], api_keys="auto")
    first = create_app(settings)
    path = settings.credentials_dir / "api_key"
    key = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert capsys.readouterr().err.count(key) == 1  # on the console once, to be copied
    assert key not in caplog.text and str(path) in caplog.text  # never into a log
    caplog.clear()
    path.chmod(0o644)
    second = create_app(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key not in caplog.text and key not in capsys.readouterr().err
    assert first.state.auth.match(key) == second.state.auth.match(key) == key
    with TestClient(second) as client:
        assert client.get("/stats").status_code == 401
        assert client.get("/stats", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    caplog.clear()  # the fixture checks only the fixed test keys; this one was meant to show


def test_query_tokens_are_masked_in_server_logs() -> None:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1,
                               '%s - "WebSocket %s" [accepted]',
                               ("127.0.0.1:5", f"/ws/v1/tts?model=x&token={KEY}"), None)
    assert RedactTokens().filter(record)
    assert KEY not in record.getMessage() and "token=***" in record.getMessage()
    assert any(isinstance(f, RedactTokens) for f in logging.getLogger("uvicorn.error").filters)
