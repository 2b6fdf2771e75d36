"""Pages of other origins cannot act through a visitor's browser (app.http.origin), and CORS
stays off unless configured.

The attacks are performed as a browser would send them: a cross-site (or cross-port) HTML form
POST carrying the Studio's session cookie, a WebSocket opened by a foreign page with the cookie.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import routing
from fastapi.testclient import TestClient
from pydantic import ValidationError
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from app.http.auth import COOKIE
from app.main import create_app
from app.settings import Settings
from tests.conftest import LiveServer, start_server, test_settings
from tests.reliability.checks import assert_openai_error

KEY = "origin-test-key-0123456789"
EVIL = "http://evil.example"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("origin-keyed"),
                                      preload=["espeak"], api_keys=KEY, auth_scope="all"))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("origin-open"), preload=["espeak"]))
    yield live
    live.stop()


def sign_in(server: LiveServer) -> str:
    response = httpx.post(server.url + "/v1/auth/session", json={"key": KEY}, timeout=30)
    assert response.status_code == 200, response.text
    return response.cookies[COOKIE]


def other_port(server: LiveServer) -> str:
    port = int(server.url.rsplit(":", 1)[1])
    return server.url.rsplit(":", 1)[0] + f":{port + 1}"


def form_post(server: LiveServer, path: str, **headers: str) -> httpx.Response:
    """What a browser sends for `<form method=post action=...>` submitted by some page."""
    return httpx.post(server.url + path, content=b"", headers=FORM | headers, timeout=60)


def status(server: LiveServer, model: str) -> str:
    return str(server.app.state.service.registry.status()[model].status)


def assert_forbidden_origin(response: httpx.Response) -> None:
    assert response.status_code == 403, response.text
    error = assert_openai_error(response.json(), status=403)
    assert error["code"] == "forbidden_origin" and error["type"] == "permission_error"


@pytest.mark.parametrize("path", ["/v1/models/espeak/unload", "/v1/models/piper/load",
                                  "/v1/models/rescan"])
@pytest.mark.parametrize("origin", ["foreign site", "other port", "null"])
def test_foreign_form_post_with_a_valid_cookie_is_refused(keyed: LiveServer, path: str,
                                                         origin: str) -> None:
    sent = {"foreign site": EVIL, "other port": other_port(keyed), "null": "null"}[origin]
    cookie = sign_in(keyed)
    before = {m: status(keyed, m) for m in ("espeak", "piper")}
    response = form_post(keyed, path, Origin=sent, Cookie=f"{COOKIE}={cookie}")
    assert_forbidden_origin(response)
    assert {m: status(keyed, m) for m in ("espeak", "piper")} == before  # nothing happened


def test_the_servers_own_pages_may_use_the_cookie(keyed: LiveServer) -> None:
    cookie = f"{COOKIE}={sign_in(keyed)}"
    unloaded = form_post(keyed, "/v1/models/espeak/unload", Origin=keyed.url, Cookie=cookie)
    assert unloaded.status_code == 200, unloaded.text
    assert status(keyed, "espeak") == "unloaded"
    # Without Origin, the Referer (sent under the Studio's same-origin policy) stands in.
    loaded = form_post(keyed, "/v1/models/espeak/load", Referer=keyed.url + "/", Cookie=cookie)
    assert loaded.status_code == 200, loaded.text
    assert status(keyed, "espeak") == "ready"
    assert_forbidden_origin(form_post(keyed, "/v1/models/espeak/unload", Referer=EVIL + "/page",
                                      Cookie=cookie))


def test_a_cookie_without_origin_or_referer_is_refused(keyed: LiveServer) -> None:
    cookie = f"{COOKIE}={sign_in(keyed)}"
    assert_forbidden_origin(form_post(keyed, "/v1/models/espeak/unload", Cookie=cookie))
    assert status(keyed, "espeak") == "ready"
    # A forged cookie authenticates nothing: the answer is about the key, not the origin.
    forged = form_post(keyed, "/v1/models/espeak/unload", Cookie=f"{COOKIE}=a.1999999999.b")
    assert forged.status_code == 401


def test_bearer_keys_are_unaffected(keyed: LiveServer) -> None:
    for origin in (EVIL, "null", None):
        headers = {"Authorization": f"Bearer {KEY}"} | ({"Origin": origin} if origin else {})
        response = form_post(keyed, "/v1/models/rescan", **headers)
        assert response.status_code == 200, (origin, response.text)


def test_every_state_changing_route_is_guarded(keyed: LiveServer) -> None:
    cookie = f"{COOKIE}={sign_in(keyed)}"
    routes = [(method, str(route.path_format))
              for route in routing.iter_route_contexts(keyed.app.routes)
              if isinstance(route.original_route, routing.APIRoute)
              for method in route.methods or () if method not in ("GET", "HEAD")]
    assert len(routes) >= 10
    for method, path in routes:
        url = keyed.url + path.replace("{", "").replace("}", "")
        response = httpx.request(method, url, content=b"", timeout=60,
                                 headers=FORM | {"Origin": EVIL, "Cookie": cookie})
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["error"]["code"] == "forbidden_origin"


def ws_url(server: LiveServer, query: str = "") -> str:
    return server.url.replace("http://", "ws://", 1) + "/ws/v1/tts" + query


def speak(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """The final frame of one request, or the close that came instead."""
    with connect(url, additional_headers=headers, proxy=None, open_timeout=30) as ws:
        try:
            ws.send(json.dumps({"model": "espeak", "input": "Who is asking?"}))
            for message in ws:
                if isinstance(message, str) and json.loads(message)["type"] in ("done", "error"):
                    return dict(json.loads(message))
        except ConnectionClosed:
            pass
        assert ws.protocol.close_rcvd is not None
        return {"close": ws.protocol.close_rcvd.code, "reason": ws.protocol.close_rcvd.reason}


def test_foreign_websocket_with_a_valid_cookie_is_refused(keyed: LiveServer) -> None:
    cookie = f"{COOKIE}={sign_in(keyed)}"
    refused = {"close": 1008, "reason": "forbidden_origin"}
    assert speak(ws_url(keyed), {"Cookie": cookie, "Origin": EVIL}) == refused
    assert speak(ws_url(keyed), {"Cookie": cookie, "Origin": other_port(keyed)}) == refused
    assert speak(ws_url(keyed), {"Cookie": cookie}) == refused  # browsers always send Origin
    assert speak(ws_url(keyed), {"Cookie": cookie, "Origin": keyed.url})["type"] == "done"


def test_websocket_keys_are_unaffected(keyed: LiveServer) -> None:
    assert speak(ws_url(keyed, f"?token={KEY}"), {"Origin": EVIL})["type"] == "done"
    assert speak(ws_url(keyed), {"Authorization": f"Bearer {KEY}", "Origin": EVIL}
                 )["type"] == "done"
    # A wrong token does not let a cookie through from a foreign page either.
    cookie = f"{COOKIE}={sign_in(keyed)}"
    assert speak(ws_url(keyed, "?token=wrong"), {"Cookie": cookie, "Origin": EVIL}
                 ) == {"close": 1008, "reason": "forbidden_origin"}


def test_an_open_server_is_not_open_to_foreign_pages(open_server: LiveServer) -> None:
    """No key, no cookie: a page elsewhere still cannot drive a server on the visitor's machine."""
    assert_forbidden_origin(form_post(open_server, "/v1/models/espeak/unload", Origin=EVIL))
    assert status(open_server, "espeak") == "ready"
    assert speak(ws_url(open_server), {"Origin": EVIL}) == {"close": 1008,
                                                            "reason": "forbidden_origin"}
    # Programs send no Origin and are served as before; so are the server's own pages.
    assert form_post(open_server, "/v1/models/rescan").status_code == 200
    assert form_post(open_server, "/v1/models/rescan", Origin=open_server.url).status_code == 200
    assert speak(ws_url(open_server), {})["type"] == "done"


# -- configured origins and CORS (in-process: no model is loaded) --------------------------------


def client(tmp: Path, **settings: Any) -> TestClient:
    return TestClient(create_app(test_settings(tmp, preload=[], **settings)))


def test_allowed_origins_may_use_the_cookie(tmp_path: Path) -> None:
    app = "http://app.example:3000"
    with client(tmp_path, api_keys=KEY, allowed_origins=app) as http:
        assert http.post("/v1/auth/session", json={"key": KEY}).status_code == 200
        assert http.post("/v1/models/rescan", headers={"Origin": app}).status_code == 200
        assert http.post("/v1/models/rescan", headers={"Origin": app.replace("3000", "3001")}
                         ).status_code == 403
        assert http.post("/v1/models/rescan", headers={"Origin": EVIL}).status_code == 403


def test_cors_is_off_unless_configured(tmp_path: Path) -> None:
    with client(tmp_path) as http:
        read = http.get("/v1/models", headers={"Origin": EVIL})
        preflight = http.options("/v1/audio/speech", headers={
            "Origin": EVIL, "Access-Control-Request-Method": "POST"})
    assert read.status_code == 200
    assert "access-control-allow-origin" not in read.headers
    assert "access-control-allow-origin" not in preflight.headers


def test_cors_for_named_origins_never_with_credentials(tmp_path: Path) -> None:
    app = "https://app.example"
    with client(tmp_path, cors_origins=app) as http:
        read = http.get("/v1/models", headers={"Origin": app})
        stranger = http.get("/v1/models", headers={"Origin": EVIL})
        preflight = http.options("/v1/audio/speech", headers={
            "Origin": app, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        sent = http.post("/v1/models/rescan", headers={"Origin": app})
    assert read.headers["access-control-allow-origin"] == app
    assert "x-request-id" in read.headers["access-control-expose-headers"].lower()
    assert "access-control-allow-origin" not in stranger.headers
    assert preflight.status_code == 200
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    for response in (read, preflight):
        assert "access-control-allow-credentials" not in response.headers
    assert sent.status_code == 200  # an origin allowed to read may also send


def test_cors_wildcard_reads_but_never_sends_with_the_cookie(tmp_path: Path) -> None:
    with client(tmp_path, api_keys=KEY, cors_origins="*") as http:
        read = http.get("/v1/models", headers={"Origin": EVIL})
        assert read.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in read.headers
        assert http.post("/v1/auth/session", json={"key": KEY}).status_code == 200
        assert http.post("/v1/models/rescan", headers={"Origin": EVIL}).status_code == 403


def test_a_wildcard_is_no_allowed_origin() -> None:
    with pytest.raises(ValidationError, match="not an origin"):
        Settings(allowed_origins="*")
    with pytest.raises(ValidationError, match="not an origin"):
        Settings(cors_origins="evil.example")
