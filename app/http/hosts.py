"""Which `Host` names a server answers: the guard against DNS rebinding.

A page on `rebind.example` can make its name resolve to 127.0.0.1 after loading; the browser
then sends the page's requests to a server on the visitor's own machine, as same-origin requests
of `rebind.example`, so the origin rule (app.http.origin) sees nothing foreign. What it cannot
change is the `Host` header: it names the page's host. So a server bound to a loopback address
answers only loopback names (`localhost`, 127.0.0.0/8, `::1`, any port) unless `allowed_hosts`
names more (`*`: any). A server bound beyond loopback (`0.0.0.0`, as in docker) answers any name,
as before, unless `allowed_hosts` is set; then it answers those and loopback names.

Refused: 400 `host_not_allowed` in OpenAI's error shape (as Django and Starlette's
TrustedHostMiddleware answer a bad Host: a client error every client and proxy reports as such;
421 Misdirected Request would fit the meaning, but browsers may retry it on another connection).
A WebSocket upgrade gets the same 400 where the server can send a response to a handshake (the
ASGI `websocket.http.response` extension, which uvicorn has), else a refused handshake (403).
A request with no `Host` (HTTP/1.0 programs) passes: browsers always send one.

The implicit loopback rule applies to connections that arrived on a loopback address: an
in-process transport (a test client) has no socket a browser could reach.
"""

from __future__ import annotations

import ipaddress
import json
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.errors import HostNotAllowed, error_body, error_response


def host_name(header: str) -> str | None:
    """The name in a `Host` value (`[::1]:8100` -> `::1`), lowercased; None if unreadable."""
    try:
        name = urlsplit(f"//{header.strip()}").hostname
    except ValueError:
        return None
    return name.rstrip(".") if name else None


def is_loopback(name: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1)."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostGuard:
    def __init__(self, app: ASGIApp, bind: str, allowed: list[str]) -> None:
        self.app = app
        self.any = "*" in allowed
        self.named = {name.strip("[]") for name in allowed if name != "*"}
        """Names allowed besides loopback ones; checked on any bind when there are some."""
        bound = host_name(bind) or bind
        self.loopback_only = is_loopback(bound) and not allowed

    def refusal(self, scope: Scope) -> str | None:
        if self.any:
            return None
        if not self.named:
            if not self.loopback_only:
                return None
            server = scope.get("server")
            if not server or not is_loopback(str(server[0])):
                return None  # not a connection to a loopback socket
        header = Headers(scope=scope).get("host")
        if header is None:
            return None
        name = host_name(header)
        if name is not None and (is_loopback(name) or name in self.named):
            return None
        return (f"This server does not answer requests for host {header[:100]!r}. Use "
                "localhost or 127.0.0.1, or add the name to VOXMUX_ALLOWED_HOSTS (a comma "
                "list; '*' answers any).")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason = self.refusal(scope) if scope["type"] in ("http", "websocket") else None
        if reason is None:
            await self.app(scope, receive, send)
            return
        error = HostNotAllowed(reason, param="host")
        if scope["type"] == "http":
            await error_response(error)(scope, receive, send)
            return
        await receive()  # websocket.connect
        if "websocket.http.response" not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})  # a refused handshake
            return
        body = json.dumps(error_body(error)).encode()
        await send({"type": "websocket.http.response.start", "status": 400, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        ]})
        await send({"type": "websocket.http.response.body", "body": body})
