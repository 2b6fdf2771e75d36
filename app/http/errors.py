"""One error table: how every error class reaches a client.

Engine and serving errors say what went wrong; this table decides, in one place, the HTTP status,
OpenAI's `type` and `code`, the close code of a VoxMux WebSocket session and that of a LunaVox
one. Every body is OpenAI's shape, `{"error": {message, type, param, code}}`. Errors that only
exist at the edge (keys, body size, WebSocket protocol breaches) are declared here too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request, routing
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.jobs.model import DiskFull, JobNotFound, JobNotReady, StoreUnavailable
from app.protocols.schemas import ErrorInfo, ErrorResponse
from app.serving import tracing
from app.serving.lexicons import LexiconNotFound
from app.text.feed import TextBacklogFull
from engines.base import (
    Cancelled,
    EngineBusy,
    InvalidParameter,
    LoadFailed,
    ModelNotFound,
    Overloaded,
    RequestTimeout,
    SynthesisFailed,
    VoiceNotFound,
    VoxMuxError,
)

log = logging.getLogger(__name__)


class InvalidApiKey(VoxMuxError):
    """No key, or not one of the server's keys."""


class Forbidden(VoxMuxError):
    """The caller is known but may not do this (e.g. cancel another client's request)."""


class HostNotAllowed(VoxMuxError):
    """The request names a `Host` this server does not answer (`allowed_hosts`)."""


class RequestNotFound(VoxMuxError):
    """No running request has that id."""


class NoSuchVoice(VoxMuxError):
    """A voice asked for as a resource (`GET .../voices/{id}`) that no model has."""


class RequestTooLarge(VoxMuxError, HTTPException):
    """The request body is over `max_request_bytes`.

    Also an `HTTPException`: FastAPI turns anything else raised while it reads a body into a
    400, but lets these through to the handlers (which find VoxMuxError's first).
    """

    def __init__(self, limit: int) -> None:
        message = f"The request body is larger than the {limit} bytes this server accepts"
        VoxMuxError.__init__(self, message)
        self.status_code, self.detail, self.headers = 413, message, None


class ClientTooSlow(VoxMuxError, HTTPException):
    """The request head or body did not arrive within its timeout; the connection is closed.

    An `HTTPException` for the same reason as `RequestTooLarge`: it is raised while FastAPI
    reads the body.
    """

    def __init__(self, part: str, seconds: float) -> None:
        message = f"The request {part} did not arrive within {seconds:g} s"
        VoxMuxError.__init__(self, message)
        self.status_code, self.detail = 408, message
        self.headers = {"Connection": "close"}  # what is left of the body is never read


class MalformedRequest(VoxMuxError):
    """Bytes the HTTP parser refuses (a bare CR or LF in a header, a broken request line)."""


class RequestHeadTooLarge(VoxMuxError):
    """The request line and headers together are over `max_header_bytes`."""


class UrlTooLong(RequestHeadTooLarge):
    """The request target (path and query string) alone is over the head limit."""


class TooManyConnections(VoxMuxError):
    """Every one of the `max_connections` connection places is taken."""


class SessionError(VoxMuxError):
    """A breach of the WebSocket protocol rather than a bad request."""


class NotJson(SessionError):
    """A message that is not a JSON object in a text frame (or nested too deep to read)."""


class MessageTooBig(SessionError):
    """A message over `ws_max_message_bytes`."""


class NoRequest(SessionError):
    """No first message within `ws_first_message_timeout`."""


class TooManySessions(SessionError):
    """Every one of the `ws_max_connections` session places is taken."""


@dataclass(frozen=True)
class ErrorKind:
    status: int
    type: str
    code: str
    ws_close: int = 1000
    """VoxMux WebSocket close code after the `error` frame (1000: the request's own fault)."""
    lunavox_close: int = 1011
    """LunaVox close code (1003 a bad request, 1013 overloaded, 1011 a server failure)."""
    breach: str | None = None
    """For a breach of the WebSocket protocol, the close reason; LunaVox then sends no frame."""


_BAD = "invalid_request_error"
_SERVER = "server_error"

TABLE: dict[type[Exception], ErrorKind] = {
    InvalidParameter: ErrorKind(400, _BAD, "invalid_value", lunavox_close=1003),
    ModelNotFound: ErrorKind(404, _BAD, "model_not_found", lunavox_close=1003),
    # 400 as OpenAI answers it (the SDK's BadRequestError), not 404: the voice is a parameter.
    VoiceNotFound: ErrorKind(400, _BAD, "voice_not_found", lunavox_close=1003),
    EngineBusy: ErrorKind(409, _BAD, "model_busy"),
    Overloaded: ErrorKind(429, "rate_limit_error", "queue_full", lunavox_close=1013),
    LoadFailed: ErrorKind(503, _SERVER, "model_load_failed"),
    SynthesisFailed: ErrorKind(500, _SERVER, "synthesis_failed"),
    RequestTimeout: ErrorKind(504, _SERVER, "timeout"),
    Cancelled: ErrorKind(499, _BAD, "cancelled", lunavox_close=1000),
    InvalidApiKey: ErrorKind(401, _BAD, "invalid_api_key", ws_close=1008, lunavox_close=1008),
    Forbidden: ErrorKind(403, "permission_error", "forbidden", ws_close=1008, lunavox_close=1008),
    HostNotAllowed: ErrorKind(400, _BAD, "host_not_allowed", ws_close=1008, lunavox_close=1008),
    RequestNotFound: ErrorKind(404, _BAD, "request_not_found"),
    NoSuchVoice: ErrorKind(404, _BAD, "voice_not_found"),
    LexiconNotFound: ErrorKind(404, _BAD, "lexicon_not_found"),
    JobNotFound: ErrorKind(404, _BAD, "job_not_found"),
    JobNotReady: ErrorKind(409, _BAD, "job_not_finished"),
    DiskFull: ErrorKind(507, _SERVER, "disk_full"),
    StoreUnavailable: ErrorKind(503, _SERVER, "job_store_unavailable"),
    RequestTooLarge: ErrorKind(413, _BAD, "request_too_large"),
    ClientTooSlow: ErrorKind(408, _BAD, "client_too_slow"),
    MalformedRequest: ErrorKind(400, _BAD, "malformed_request"),
    RequestHeadTooLarge: ErrorKind(431, _BAD, "request_head_too_large"),
    UrlTooLong: ErrorKind(414, _BAD, "url_too_long"),
    TooManyConnections: ErrorKind(503, _SERVER, "too_many_connections", 1013, 1013),
    NotJson: ErrorKind(400, _BAD, "invalid_json", 1003, 1003, "expected a JSON object"),
    MessageTooBig: ErrorKind(413, _BAD, "message_too_large", 1009, 1009, "message too big"),
    NoRequest: ErrorKind(408, _BAD, "timeout", 1008, 1008, "no request in time"),
    TooManySessions: ErrorKind(
        429, "rate_limit_error", "too_many_connections", 1013, 1013, "too many connections"
    ),
    TextBacklogFull: ErrorKind(
        413, _BAD, "text_backlog_full", 1008, 1008, "too much text waiting"
    ),
}
INTERNAL = ErrorKind(500, _SERVER, "internal_error", 1011, 1011)
"""Anything not in the table: a bug, reported without its details."""


def kind_of(exc: BaseException) -> ErrorKind:
    for cls in type(exc).__mro__:
        if cls in TABLE:
            return TABLE[cls]
    return INTERNAL


def as_voxmux(exc: BaseException) -> VoxMuxError:
    """`exc` itself when it is one of ours, else a generic failure that reveals nothing."""
    if isinstance(exc, VoxMuxError):
        return exc
    return VoxMuxError("The server failed to process the request.")


def error_body(exc: BaseException) -> dict[str, Any]:
    error = as_voxmux(exc)
    kind = kind_of(error)
    info = ErrorInfo(message=error.message, type=kind.type, param=error.param,
                     code=error.code or kind.code)
    return ErrorResponse(error=info).model_dump()


def error_headers(exc: BaseException) -> dict[str, str]:
    headers = dict(getattr(exc, "headers", None) or {})
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(exc.retry_after)
    elif isinstance(exc, TooManyConnections):
        headers.update({"Retry-After": "1", "Connection": "close"})
    return headers


def error_response(exc: BaseException) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=kind_of(as_voxmux(exc)).status,
                        headers=error_headers(exc) or None)


_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


def _plain(status: int, message: str, *, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    kind = _HTTP_TYPES.get(status, _BAD if status < 500 else _SERVER)
    info = ErrorInfo(message=message, type=kind, param=param, code=code)
    return JSONResponse(ErrorResponse(error=info).model_dump(), status_code=status, headers=headers)


def describe_validation_error(error: dict[str, Any]) -> tuple[str | None, str]:
    # The request part (body, query) and union member names (voice.str) are not the parameter.
    noise = {"body", "query", "path", "str", "VoiceRef", "float", "int"}
    loc = [str(p) for p in error.get("loc", ()) if str(p) not in noise]
    param = ".".join(loc) or None
    kind = error.get("type", "")
    if kind == "json_invalid":
        return None, "The request body is not valid JSON: " + str(error.get("ctx", {}).get("error"))
    if kind == "missing":
        return param, f"Missing required parameter: '{param}'."
    if kind == "extra_forbidden":
        return param, f"Unrecognized request argument supplied: '{param}'."
    return param, f"Invalid value for '{param}': {error.get('msg', 'invalid')}."


async def _on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    first = exc.errors()[0] if exc.errors() else {}
    param, message = describe_validation_error(first)
    tracing.failed(InvalidParameter(message, param=param))
    return _plain(400, message, param=param, code=first.get("type"))


Shape = Callable[[BaseException], JSONResponse]


def shape_errors(app: FastAPI, prefixes: tuple[str, ...], respond: Shape) -> None:
    """Errors of routes under `prefixes` in another protocol's shape (ElevenLabs')."""
    shapes: list[tuple[tuple[str, ...], Shape]] = getattr(app.state, "error_shapes", [])
    app.state.error_shapes = [*shapes, (prefixes, respond)]


def shaped_response(scope: Any, exc: BaseException) -> JSONResponse:
    """The error answer for a request to `scope`'s path: another protocol's shape under its
    prefixes (`shape_errors`), else OpenAI's."""
    tracing.failed(exc)
    state = getattr(scope.get("app"), "state", None)
    for prefixes, respond in getattr(state, "error_shapes", ()):
        if scope["path"].startswith(prefixes):
            response: JSONResponse = respond(exc)
            return response
    return error_response(exc)


def _respond(request: Request, exc: BaseException) -> JSONResponse:
    return shaped_response(request.scope, exc)


async def _on_voxmux(request: Request, exc: VoxMuxError) -> JSONResponse:
    if kind_of(exc).status >= 500:
        log.warning("request failed: %s", exc.message)
    return _respond(request, exc)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the routes of `path` take. Routes with a literal path shadow parameterized
    ones (`/v1/models/switch` is not a model id)."""
    matching = [route for route in routing.iter_route_contexts(app.routes)
                if route.methods and getattr(route, "path_regex", None) is not None
                and route.path_regex.match(path)]
    literal = [route for route in matching if "{" not in str(route.path_format)]
    return sorted({method for route in literal or matching for method in route.methods or ()})


async def _on_http(request: Request, exc: HTTPException) -> JSONResponse:
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 405 and headers is not None:
        # Starlette names the methods of the first route whose path matches, not all of them.
        headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope["path"]))
    if any(request.scope["path"].startswith(prefixes)
           for prefixes, _ in getattr(request.app.state, "error_shapes", ())):
        return _respond(request, HTTPException(exc.status_code, str(exc.detail), headers))
    return _plain(exc.status_code, str(exc.detail), headers=headers)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return _respond(request, exc)


class Unhandled:
    """A bug's exception answered here, inside the other layers, as a 500 in the error shape:
    the answer passes them (request id, security headers) and nothing is raised on to the
    server, which would drop the kept-alive connection after the answer without saying so
    (Starlette's outermost handler answers, then raises again). A failure after the answer
    began is raised on: the transfer must not look whole."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error", exc_info=exc)
            await shaped_response(scope, exc)(scope, receive, send)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(VoxMuxError, _on_voxmux)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected)
