"""Pages of other origins cannot make a visitor's browser change anything here.

A browser attaches the Studio's session cookie to requests any page makes (SameSite=Strict stops
other sites, not another port of the same host), and it reaches servers on the visitor's own
machine and LAN that the page's author cannot. So every request that changes state (any method
but GET, HEAD and OPTIONS) and every WebSocket handshake (WebSockets have no same-origin policy)
must come from a page of this server's own origin (`Origin`, else `Referer`, against the
request's scheme and `Host`) or of `allowed_origins`, unless it carries a valid API key in
`Authorization: Bearer` (or `?token=` on a WebSocket): a key is its holder's intent, and a page
cannot add that header cross-origin unless CORS lets it.

Requests with neither `Origin` nor `Referer` come from programs, not pages, and pass, unless they
carry a valid session cookie: browsers send `Origin` with every POST, fetch and WebSocket, so a
cookie without one is refused rather than trusted.

Refused: HTTP 403 `forbidden_origin`; a WebSocket is accepted and closed with 1008
`forbidden_origin` (a close before the handshake reaches a browser as a bare failure).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.auth import COOKIE, WS_POLICY_VIOLATION, Authenticator
from app.http.errors import Forbidden, error_response

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": 80, "https": 443}
REFUSED = "forbidden_origin"

Origin = tuple[str, str, int]
"""scheme, host, port: what two URLs must share to be of one origin."""


def parse_origin(text: str) -> Origin | None:
    """The origin of a URL or `Origin` value; None for `null`, other schemes, garbage."""
    try:
        url = urlsplit(text.strip())
        scheme, host, port = url.scheme.lower(), url.hostname, url.port
    except ValueError:
        return None
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host.lower(), port or DEFAULT_PORTS[scheme]


def own_origin(scope: Scope) -> Origin | None:
    """The origin the client addressed: the request's scheme (ws counts as http) and `Host`."""
    scheme = str(scope["scheme"])
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    host = Headers(scope=scope).get("host")
    if not host and scope.get("server"):
        address, port = scope["server"]
        host = f"[{address}]:{port}" if ":" in str(address) else f"{address}:{port}"
    return parse_origin(f"{scheme}://{host}") if host else None


class OriginGuard:
    def __init__(self, app: ASGIApp, auth: Authenticator, allowed: list[str]) -> None:
        self.app = app
        self.auth = auth
        self.allowed = {o for o in map(parse_origin, allowed) if o is not None}

    def refusal(self, scope: Scope) -> str | None:
        """Why this request may not proceed, or None."""
        websocket = scope["type"] == "websocket"
        if not websocket and scope["method"] in SAFE_METHODS:
            return None
        conn = HTTPConnection(scope)
        if self.auth.enabled and self.auth.presents_key(conn, query_token=websocket):
            return None
        claimed, header = conn.headers.get("origin"), "Origin"
        if claimed is None:
            claimed, header = conn.headers.get("referer"), "Referer"
        if claimed is None:
            if self.auth.session_valid(conn.cookies.get(COOKIE)):
                return ("A request signed in with the session cookie must carry the Origin "
                        "header browsers send; programs should send an API key as "
                        "'Authorization: Bearer <key>'.")
            return None
        origin = parse_origin(claimed)
        if origin is not None and (origin == own_origin(scope) or origin in self.allowed):
            return None
        return (f"Cross-origin request refused: {header} {claimed[:100]!r} is not this server's "
                "origin. Send an API key as 'Authorization: Bearer <key>', or list the origin "
                "in VOXMUX_ALLOWED_ORIGINS.")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        reason = self.refusal(scope) if scope["type"] in ("http", "websocket") else None
        if reason is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await error_response(Forbidden(reason, code=REFUSED))(scope, receive, send)
        else:
            await receive()  # websocket.connect
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": WS_POLICY_VIOLATION,
                        "reason": REFUSED})
