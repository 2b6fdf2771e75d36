"""Wire-level accommodations for clients VoxMux did not write.

`Http10Bodies`: an HTTP/1.0 client cannot read chunked transfer encoding, which uvicorn uses for
every response without a `Content-Length` (the streamed speech routes). For such a client the
response is collected and sent whole with its `Content-Length`: it loses streaming, not audio.
A response that fails before it is complete is never sent half: the client gets a 500.

`ErrorDetail`: HayaKoe's clients read FastAPI's `detail` from an error body. On the routes that
take HayaKoe's requests (`/api/tts`, `/api/tts/stream`), JSON error bodies carry `detail` (the
message) beside OpenAI's `error`, whichever layer produced the error.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def _collect(app: ASGIApp, scope: Scope, receive: Receive, send: Send,
                   wanted: Callable[[Message], bool],
                   rewrite: Callable[[Message, bytes], tuple[Message, bytes]]) -> None:
    """Run `app`; a response whose start `wanted` accepts is held until complete, passed through
    `rewrite` and sent with its `Content-Length`. Others pass untouched."""
    start: Message | None = None
    chunks: list[bytes] = []

    async def hold(message: Message) -> None:
        nonlocal start
        if message["type"] == "http.response.start" and wanted(message):
            start = message
            return
        if start is None or message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        head, body = rewrite(start, b"".join(chunks))
        headers = [(k, v) for k, v in head.get("headers", ())
                   if k.lower() not in (b"content-length", b"transfer-encoding")]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**head, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    await app(scope, receive, hold)


def _header(message: Message, name: bytes) -> bytes | None:
    return next((v for k, v in message.get("headers", ()) if k.lower() == name), None)


class Http10Bodies:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("http_version") != "1.0":
            await self.app(scope, receive, send)
            return

        def unsized(start: Message) -> bool:
            return _header(start, b"content-length") is None

        def close(start: Message, body: bytes) -> tuple[Message, bytes]:
            headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"connection"]
            return {**start, "headers": [*headers, (b"connection", b"close")]}, body

        await _collect(self.app, scope, receive, send, unsized, close)


class ErrorDetail:
    def __init__(self, app: ASGIApp, paths: tuple[str, ...]) -> None:
        self.app = app
        self.paths = paths

    def _applies(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in self.paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._applies(scope["path"]):
            await self.app(scope, receive, send)
            return

        def json_error(start: Message) -> bool:
            kind = _header(start, b"content-type") or b""
            return int(start["status"]) >= 400 and kind.startswith(b"application/json")

        def add_detail(start: Message, body: bytes) -> tuple[Message, bytes]:
            try:
                payload = json.loads(body)
                payload["detail"] = payload["error"]["message"]
            except (ValueError, KeyError, TypeError):
                return start, body
            return start, json.dumps(payload, separators=(",", ":")).encode()

        await _collect(self.app, scope, receive, send, json_error, add_detail)
