"""Bounds on what one client can make the server hold: its request body, its unread frames.

Every route parses its whole body before validating it, so without a bound one large POST could
take as much memory as it likes before `max_input_chars` ever refuses it. A declared
`Content-Length` over the bound is answered 413 at once; a chunked body is counted as it arrives
and refused as soon as it passes the bound.

A body that stops arriving (a chunked body never ended, one shorter than its Content-Length)
would hold its connection and the route waiting for it forever: the whole body must arrive
within `body_timeout` seconds of the request head, else 408 and the connection is closed. (The
head itself is bounded below the app, in app.http.connections.)

A WebSocket client that stops reading blocks every frame sent to it, and uvicorn never drops
such a connection itself (its close waits for a flush that never comes), so the session would
keep its connection place forever. A send that waits too long ends the session instead.
"""

from __future__ import annotations

import asyncio
import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.http.errors import ClientTooSlow, RequestTooLarge, shaped_response

log = logging.getLogger(__name__)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, larger: dict[str, int] | None = None
                 ) -> None:
        """`larger`: routes (exact paths) that take bodies up to their own bound."""
        self.app = app
        self.max_bytes = max_bytes
        self.larger = larger or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.larger.get(scope["path"], self.max_bytes)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            await shaped_response(scope, RequestTooLarge(limit))(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise RequestTooLarge(limit)  # the app's handler answers 413
            return message

        await self.app(scope, counted, send)


class BodyTimeout:
    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.seconds
        complete = False

        async def timed() -> Message:
            nonlocal complete
            if complete:  # later reads wait for a disconnect, which may take all day
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                log.info("a request body did not arrive within %g s; closing", self.seconds)
                raise ClientTooSlow("body", self.seconds) from None
            complete = message["type"] != "http.request" or not message.get("more_body")
            return message

        await self.app(scope, timed, send)


class ClientStalled(OSError):
    """A frame waited past the send timeout: the client stopped reading.

    An OSError, which Starlette's WebSocket turns into `WebSocketDisconnect(1006)`: the session
    ends as if the client had left, without trying to send it anything more.
    """


class WebSocketSendTimeout:
    def __init__(self, app: ASGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return

        async def timed(message: Message) -> None:
            if message["type"] != "websocket.send":
                await send(message)
                return
            try:
                async with asyncio.timeout(self.seconds):
                    await send(message)
            except TimeoutError:
                log.info("ws: the client read nothing for %g s; the session ends", self.seconds)
                raise ClientStalled(f"the client read nothing for {self.seconds:g} s") from None

        await self.app(scope, receive, timed)
