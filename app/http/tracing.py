"""The root span of every HTTP request and WebSocket session, when this process traces.

It carries what a user filters on at the edge: the method, path and route, the status sent, the
request id of `X-Request-ID` and the client (`app.http.clients`). The speech job adds the model,
voice, format, characters, audio seconds and cache (`app.serving.job`); errors are recorded on it
where they become the client's answer (`app.http.errors`) or the job's end.
"""

from __future__ import annotations

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.http.clients import client_id
from app.serving import tracing


class TracingMiddleware:
    """Installed inside `RequestIdMiddleware`, whose id it reads."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "WS")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]
                   if k in (b"traceparent", b"tracestate")}
        attributes = {
            "http.request.method": method,
            "url.path": scope["path"],
            "voxmux.request_id": scope.get("state", {}).get("request_id", ""),
            "voxmux.client": client_id(HTTPConnection(scope)),
        }
        with tracing.root(f"{method} {scope['path']}", headers, attributes) as span:

            async def watched(message: Message) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            try:
                await self.app(scope, receive, watched)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
