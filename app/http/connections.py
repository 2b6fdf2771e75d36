"""What uvicorn does with connections before and around the app; one function configures it.

`server_config(app, settings)` is the one place Settings become uvicorn's configuration: both
`voxmux serve` and the tests' servers call it, so the tests run what users run.

uvicorn bounds idle keep-alive connections (`timeout_keep_alive`) and nothing else: a connection
that never finishes its request head is held forever, and so is one whose client stops reading;
a head may be any size (httptools keeps whatever comes); the number of connections is unbounded
(`limit_concurrency` answers each request over it with a plain-text 503 and a logged warning); a
request it cannot parse gets a plain-text 400; an invalid UTF-8 WebSocket text frame logs a
traceback. The ASGI app sees none of this, so two small subclasses of uvicorn's own protocols
(the ones its `auto` setting picks with uvicorn[standard]: httptools, websockets' sans-I/O)
close those gaps where they arise:

- send timeout: while the client accepts no bytes of a response (its window is full), a timer
  runs; when it fires the connection is dropped, and the app sees a client that hung up (its
  job is cancelled, its audio freed).
- head timeout: a timer runs from the connection's start, and again from each response's end,
  until the next request head is complete; when it fires the connection is closed, after a 408
  if a request had begun. (The body is bounded in the app: app.http.limits.BodyTimeout.)
- head size: the request target and headers are counted as the parser hands them over; past
  `max_header_bytes` the answer is 414 (target) or 431 (headers) and the connection is closed.
- connection cap: a connection made while `max_connections` others are open (HTTP and
  WebSocket alike) gets its request answered 503 `too_many_connections` (a WebSocket: close
  1013) and is closed; it holds its place only until then, and no longer than the head timeout.
- a request the parser refuses (and a malformed WebSocket upgrade) gets OpenAI's error shape
  instead of plain text.
- an invalid UTF-8 text frame closes the WebSocket with 1007, logged in one debug line.

These subclasses use uvicorn's private protocol classes, so they hold for the uvicorn versions
they are tested with: `UVICORN_RANGE`, the range pyproject.toml declares. 0.55.0 is the first
with everything used here (websockets' sans-I/O protocol arrived in 0.35, its `frames` in 0.50,
`handle_handshake_exception` in 0.55; before it an upgrade whose head websockets refuses was
never answered). `make uvicorn-floor` runs the connection tests against the lowest version.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send
from websockets.http11 import Request

from app.http.errors import (
    ClientTooSlow,
    MalformedRequest,
    RequestHeadTooLarge,
    TooManyConnections,
    UrlTooLong,
    error_body,
    error_response,
    kind_of,
)
from app.http.headers import raw_headers
from app.http.requestid import HEADER as REQUEST_ID
from app.settings import Settings
from engines.base import VoxMuxError

try:
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
except ImportError as exc:  # an older uvicorn than pyproject.toml allows
    raise ImportError(f"VoxMux needs uvicorn>=0.55 (installed: {uvicorn.__version__}): "
                      f"{exc}") from exc

UVICORN_RANGE = ">=0.55"
"""The uvicorn versions this module is written and tested for: pyproject.toml's range, and the
one named in the import error above (tests/app/http/test_uvicorn_range.py keeps them equal)."""
log = logging.getLogger(__name__)

WS_MAX_SIZE = 1 << 20
"""uvicorn's bound on one WebSocket message (the app's own, smaller one answers first)."""
URL_PARSER_LIMIT = 65535
"""httptools parses no longer request target (its offsets are 16-bit)."""
WS_INVALID_DATA = 1007


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10
    send_timeout: float = 300
    max_connections: int = 512
    max_header_bytes: int = 65536

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(settings.header_timeout, settings.http_send_timeout, settings.max_connections,
                   settings.max_header_bytes)


def raw_error(exc: VoxMuxError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP/1.1 error response in OpenAI's shape, for a connection about to close."""
    body = json.dumps(error_body(exc)).encode()
    headers = [
        *default_headers,
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        (REQUEST_ID.encode(), uuid.uuid4().hex.encode()),
        *raw_headers(),
    ]
    head = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    return STATUS_LINE[kind_of(exc).status] + head + b"\r\n" + body


_last_crowded_log = 0.0


def _crowded(limit: int) -> TooManyConnections:
    global _last_crowded_log
    now = time.monotonic()
    if now - _last_crowded_log > 60:  # a flood of refusals is one line a minute
        _last_crowded_log = now
        log.warning("%d connections are open (VOXMUX_MAX_CONNECTIONS); refusing more", limit)
    return TooManyConnections(
        f"The server has {limit} open connections, its limit; retry shortly."
    )


def crowded_app(limit: int) -> ASGIApp:
    """The app a connection over the cap gets: one refusal, then the connection closes."""

    async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
        error = _crowded(limit)
        if scope["type"] == "websocket":
            await receive()
            await send({"type": "websocket.accept"})
            await send({"type": "websocket.close", "code": kind_of(error).ws_close,
                        "reason": "too many connections"})
        elif scope["type"] == "http":
            response = error_response(error)
            response.headers[REQUEST_ID] = uuid.uuid4().hex
            for name, value in raw_headers():
                response.headers[name.decode()] = value.decode()
            await response(scope, receive, send)

    return refuse


class _HeadRefused(Exception):
    """Raised from a parser callback: httptools wraps it and uvicorn sends its 400."""


class HttpProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None
        self._head_begun = False
        self._head_bytes = 0
        self._refusal: VoxMuxError | None = None

    # connection lifetime

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        crowded = len(self.connections) >= self.limits.max_connections
        super().connection_made(transport)
        if crowded:
            self.app = crowded_app(self.limits.max_connections)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._unstall()
        super().connection_lost(exc)

    # the send timer: runs while the client accepts no bytes (the transport's buffer is full)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.limits.send_timeout, self._stalled)

    def resume_writing(self) -> None:
        self._unstall()
        super().resume_writing()

    def _unstall(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _stalled(self) -> None:
        self._stall_timer = None
        client = "{}:{}".format(*self.client) if self.client else "a client"
        log.info("%s read nothing for %g s; dropping its connection", client,
                 self.limits.send_timeout)
        self.transport.abort()  # the app sees a client that hung up

    # the head timer: from the start or the last response until the next head is complete

    def _arm(self) -> None:
        self._disarm()
        self._head_begun = False
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_begun:  # a request began and stalled: say why it ends
            error = ClientTooSlow("head", self.limits.header_timeout)
            self.transport.write(raw_error(error, self.server_state.default_headers))
        self.transport.close()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            self._arm()

    # parser callbacks: count the head, stop the timer when it is complete

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begun = True
        self._head_bytes = 0

    def _count(self, size: int, refusal: type[RequestHeadTooLarge], limit: int) -> None:
        self._head_bytes += size
        if self._head_bytes > limit:
            self._refusal = refusal(
                f"The request head is larger than the {limit} bytes this server accepts"
            )
            raise _HeadRefused

    def on_url(self, url: bytes) -> None:
        limit = min(self.limits.max_header_bytes, URL_PARSER_LIMIT)
        self._count(len(url), UrlTooLong, limit)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, RequestHeadTooLarge, self.limits.max_header_bytes)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to any request its parser refuses, in OpenAI's shape."""
        self._disarm()
        error = self._refusal or MalformedRequest(
            "The request is not valid HTTP/1.1 (for example a bare CR or LF in a header)"
        )
        self.transport.write(raw_error(error, self.server_state.default_headers))
        self.transport.close()


class WebSocketProtocol(WebSocketsSansIOProtocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        crowded = len(self.connections) >= self.limits.max_connections
        super().connection_made(transport)
        if crowded:
            self.app = crowded_app(self.limits.max_connections)

    def handle_connect(self, event: Request) -> None:
        response = self.conn.accept(event)  # only a check until a response is sent
        if response.status_code == 101:
            super().handle_connect(event)
            return
        # uvicorn would send websockets' plain-text refusal of a malformed upgrade request.
        self.request, self.response = event, response
        self.handshake_initiated = True
        self._refuse(response.status_code, response.body.decode(errors="replace").strip())

    def handle_handshake_exception(self) -> None:
        """The request could not even be parsed (websockets may have queued a 414 or 431)."""
        answered = b"".join(self.conn.data_to_send())
        status = int(answered[9:12]) if answered[9:12].isdigit() else 400
        self._refuse(status, f"Failed to open a WebSocket connection: {self.conn.handshake_exc}")

    def _refuse(self, status: int, message: str) -> None:
        self.handshake_complete = True
        self.close_sent = True
        refusal = {414: UrlTooLong, 431: RequestHeadTooLarge}.get(status, MalformedRequest)
        self.transport.write(raw_error(refusal(message), self.default_headers))
        self.transport.close()

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not self.close_sent:
            try:
                b"".join(self.frames).decode()
            except UnicodeDecodeError:
                # uvicorn logs a traceback here; a client's bad bytes are not a server error.
                self.logger.debug("WebSocket text frame is not valid UTF-8; closing with 1007")
                self.frames = []
                self.conn.send_close(WS_INVALID_DATA, "invalid UTF-8")
                self.handle_parser_exception()
                return
        super().send_receive_event_to_app()


def server_config(app: ASGIApp, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's configuration for `settings`; `overrides` are uvicorn.Config keywords."""
    limits = ConnectionLimits.of(settings)
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "log_level": settings.log_level,
        "log_config": None,  # app.cli.logs configures logging; tests capture the root logger
        "http": type("VoxMuxHttpProtocol", (HttpProtocol,), {"limits": limits}),
        "ws": type("VoxMuxWebSocketProtocol", (WebSocketProtocol,), {"limits": limits}),
        "ws_max_size": WS_MAX_SIZE,
        "timeout_keep_alive": settings.keepalive_timeout,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)

