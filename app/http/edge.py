"""Everything between a client and the routes, installed by one call.

`install(app, settings)` gives an app VoxMux's keys and sessions, its error table, the limits
on what a client may make it hold, the allowed hosts, the same-origin rule, security headers,
optional CORS and an honest OpenAPI schema. Any app serving VoxMux's routes calls it (the
single-process app in app.main; a scale-out ingress too). What happens below the app, in the HTTP
server, is app.http.connections.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from app.http import errors, openapi
from app.http.auth import Authenticator, install_log_redaction, resolve_keys
from app.http.compat import ErrorDetail, Http10Bodies
from app.http.headers import SecurityHeaders
from app.http.hosts import HostGuard
from app.http.limits import BodyLimitMiddleware, BodyTimeout, WebSocketSendTimeout
from app.http.origin import OriginGuard
from app.http.requestid import RequestIdMiddleware
from app.settings import Settings

EXPOSED_HEADERS = [
    "X-Request-ID", "X-VoxMux-Stats", "X-VoxMux-Warnings", "X-VoxMux-Normalization",
    "X-VoxMux-Cache", "X-Lunavox-Stats", "X-Sample-Rate", "Retry-After",
]


def install(app: FastAPI, settings: Settings) -> Authenticator:
    keys = [key.get_secret_value() for key in settings.api_keys]
    auth = Authenticator(
        resolve_keys(keys, settings.credentials_dir), settings.auth_scope, settings.session_ttl
    )
    app.state.auth = auth
    install_log_redaction()
    errors.install(app)
    # Added innermost first: a refusal by any layer still passes the ones outside it, so it
    # carries the request id, the security headers and (when on) CORS headers.
    app.add_middleware(errors.Unhandled)  # innermost: its 500 passes every layer below
    larger = dict.fromkeys(("/v1/audio/jobs", "/v1/audio/batch", "/studio/jobs"),
                           settings.jobs_max_request_bytes)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_request_bytes, larger=larger)
    app.add_middleware(BodyTimeout, seconds=settings.body_timeout)
    app.add_middleware(WebSocketSendTimeout, seconds=settings.ws_send_timeout)
    explicit = [origin for origin in settings.cors_origins if origin != "*"]
    app.add_middleware(OriginGuard, auth=auth, allowed=settings.allowed_origins + explicit)
    app.add_middleware(HostGuard, bind=settings.host, allowed=settings.allowed_hosts)
    app.add_middleware(ErrorDetail, paths=("/api/tts",))  # HayaKoe's clients read `detail`
    app.add_middleware(Http10Bodies)  # no chunked encoding for HTTP/1.0 clients
    app.add_middleware(RequestIdMiddleware)
    app.add_middleware(SecurityHeaders)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=settings.cors_origins, allow_credentials=False,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=EXPOSED_HEADERS, max_age=600,
        )
    openapi.install(app, auth, settings.max_input_chars)
    return auth
