"""Every error leaves VoxMux in OpenAI's shape: `{"error": {message, type, param, code}}`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from app.protocols.schemas import ErrorInfo, ErrorResponse
from engines.base import Overloaded, VoxMuxError

log = logging.getLogger(__name__)

_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}


def error_body(exc: VoxMuxError) -> dict[str, Any]:
    info = ErrorInfo(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
    return ErrorResponse(error=info).model_dump()


def error_response(exc: VoxMuxError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Overloaded) else None
    return JSONResponse(error_body(exc), status_code=exc.status, headers=headers)


def _plain(status: int, message: str, *, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    kind = _HTTP_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
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
    return _plain(400, message, param=param, code=first.get("type"))


async def _on_voxmux(_: Request, exc: VoxMuxError) -> JSONResponse:
    if exc.status >= 500:
        log.warning("request failed: %s", exc.message)
    return error_response(exc)


async def _on_http(_: Request, exc: HTTPException) -> JSONResponse:
    headers = dict(exc.headers) if exc.headers else None
    return _plain(exc.status_code, str(exc.detail), headers=headers)


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return _plain(500, "The server failed to process the request.", code="internal_error")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation)  # type: ignore[arg-type]
    app.add_exception_handler(VoxMuxError, _on_voxmux)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _on_http)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _on_unexpected)
