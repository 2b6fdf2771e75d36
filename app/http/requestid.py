"""`X-Request-ID` on every HTTP response: the client's own when well-formed, else a new one; also
on the request's root span when this process traces."""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.serving import tracing

HEADER = "x-request-id"
_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{5,63}$")


def pick_request_id(supplied: str | None) -> str:
    if supplied and _VALID.match(supplied):
        return supplied
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        supplied = dict(scope["headers"]).get(HEADER.encode(), b"").decode("latin-1")
        request_id = pick_request_id(supplied)
        scope.setdefault("state", {})["request_id"] = request_id
        tracing.current().set_attribute("voxmux.request_id", request_id)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
