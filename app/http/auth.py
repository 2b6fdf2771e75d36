"""API keys: `Authorization: Bearer`, `?token=` on WebSockets, or a signed session cookie.

`VOXMUX_API_KEYS` empty leaves the server open; a comma list sets the keys; `auto` generates one
key on first start, stores it with mode 0600 under `credentials_dir` and prints it that once on
the console (stderr), never through logging: a log may go to a file (`log_dir`), a key must not.
Scope `admin` guards /stats, /requests and the model admin routes; `all` guards synthesis and
listings too (only /health and the session routes stay open). Keys are compared with
`hmac.compare_digest` and never echoed: not in error bodies, not in logs (query-string tokens
are masked in uvicorn's log lines).

A session cookie is `nonce.expiry.signature`, the signature an HMAC of `nonce.expiry` under the
key that opened the session: it needs no server-side store, and rotating the key ends it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any, Literal

from fastapi import Request, WebSocket
from starlette.requests import HTTPConnection

from app.http.errors import InvalidApiKey

log = logging.getLogger(__name__)

Scope = Literal["admin", "all"]
COOKIE = "voxmux_session"
KEY_FILE = "api_key"
WS_POLICY_VIOLATION = 1008
_SIGNING_CONTEXT = b"voxmux-session\x00"


MESSAGE = (
    "Incorrect API key provided. Send a VoxMux API key as 'Authorization: Bearer <key>' "
    "(WebSockets: '?token=<key>'; browsers: POST /v1/auth/session)."
)


def auto_key(directory: Path) -> str:
    """The key in `directory/api_key`, generated (0600, atomically, shown once) if absent."""
    path = directory / KEY_FILE
    existing = _read_key(path)
    if existing:
        return existing
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = "vmx-" + secrets.token_urlsafe(32)
    tmp = directory / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(key + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, path)  # unlike rename, never replaces a key another process just wrote
        except FileExistsError:
            return _read_key(path) or key
    finally:
        tmp.unlink(missing_ok=True)
    print(f"VOXMUX_API_KEYS=auto: generated API key {key} (stored in {path}; shown only once, "
          "on this console)", file=sys.stderr, flush=True)
    log.warning("VOXMUX_API_KEYS=auto: generated a new API key, stored in %s (printed on the "
                "console, never logged)", path)
    return key


def _read_key(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    if path.stat().st_mode & 0o077:
        log.warning("%s is readable by others; tightening it to 0600", path)
        path.chmod(0o600)
    return text or None


def resolve_keys(configured: list[str], credentials_dir: Path) -> tuple[str, ...]:
    if [k.lower() for k in configured] == ["auto"]:
        return (auto_key(credentials_dir),)
    return tuple(configured)


def _raw(text: str) -> bytes:
    """Bytes of client-sent text for `compare_digest`, which refuses non-ASCII `str`; lone
    surrogates pass through rather than fail."""
    return text.encode("utf-8", "surrogatepass")


def _sign(key: str, payload: str) -> str:
    return hmac.new(key.encode(), _SIGNING_CONTEXT + payload.encode(), hashlib.sha256).hexdigest()


class Authenticator:
    def __init__(self, keys: tuple[str, ...], scope: Scope, session_ttl: float) -> None:
        self._keys = tuple(k for k in keys if k)
        self.scope = scope
        self.session_ttl = session_ttl
        self._revoked: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def match(self, candidate: str | None) -> str | None:
        """The configured key equal to `candidate`, compared in constant time against all."""
        if not candidate:
            return None
        found = None
        for key in self._keys:
            if hmac.compare_digest(_raw(candidate), key.encode()):
                found = key
        return found

    def open_session(self, key: str) -> tuple[str, int]:
        nonce = secrets.token_urlsafe(18)
        expires = int(time.time() + self.session_ttl)
        payload = f"{nonce}.{expires}"
        return f"{payload}.{_sign(key, payload)}", expires

    def session_valid(self, cookie: str | None) -> bool:
        if not cookie or cookie.count(".") != 2:
            return False
        nonce, expires, signature = cookie.split(".")
        fresh = expires.isascii() and expires.isdigit() and int(expires) >= time.time()
        if not fresh or nonce in self._revoked:
            return False
        payload = f"{nonce}.{expires}"
        valid = False
        for key in self._keys:
            if hmac.compare_digest(_raw(signature), _sign(key, payload).encode()):
                valid = True
        return valid

    def close_session(self, cookie: str | None) -> None:
        if not self.session_valid(cookie):
            return
        assert cookie is not None
        nonce, expires, _ = cookie.split(".")
        now = time.time()
        self._revoked = {n: t for n, t in self._revoked.items() if t >= now}
        self._revoked[nonce] = float(expires)

    def presented_key(self, conn: HTTPConnection, *, query_token: bool = False) -> str | None:
        """The valid key in `Authorization: Bearer`, ElevenLabs' `xi-api-key` (or `?token=`),
        if one was sent."""
        scheme, _, credentials = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and (key := self.match(credentials.strip())):
            return key
        if key := self.match(conn.headers.get("xi-api-key", "").strip()):
            return key
        return self.match(conn.query_params.get("token")) if query_token else None

    def presents_key(self, conn: HTTPConnection, *, query_token: bool = False) -> bool:
        """A valid key in `Authorization: Bearer` (or `?token=`), not just the session cookie."""
        return self.presented_key(conn, query_token=query_token) is not None

    def authorized(self, conn: HTTPConnection, *, query_token: bool = False) -> bool:
        if not self.enabled:
            return True
        if self.presents_key(conn, query_token=query_token):
            return True
        return self.session_valid(conn.cookies.get(COOKIE))

    def guards_synthesis(self) -> bool:
        return self.enabled and self.scope == "all"


def authenticator(conn: HTTPConnection) -> Authenticator:
    auth: Authenticator = conn.app.state.auth
    return auth


async def require_admin(request: Request) -> None:
    """Router dependency: /stats, /requests and model admin routes under either scope."""
    if not authenticator(request).authorized(request):
        raise InvalidApiKey(MESSAGE)


async def require_synthesis(request: Request) -> None:
    """Router dependency: synthesis, listings and metrics, guarded only under scope `all`."""
    auth = authenticator(request)
    if auth.guards_synthesis() and not auth.authorized(request):
        raise InvalidApiKey(MESSAGE)


async def authorize_websocket(websocket: WebSocket) -> bool:
    """Call before `accept()`. Refused: accepts, closes with 1008 and returns False."""
    auth = authenticator(websocket)
    if not auth.guards_synthesis() or auth.authorized(websocket, query_token=True):
        return True
    # Accepted first: a close before the handshake reaches a browser as a bare 403, no code.
    await websocket.accept()
    await websocket.close(code=WS_POLICY_VIOLATION, reason="invalid_api_key")
    return False


_TOKEN = re.compile(r"((?:^|[?&])token=)[^&\s\"']*")


class RedactTokens(logging.Filter):
    """Masks `token=` query values in log lines (uvicorn logs WebSocket paths with queries)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(a) for a in record.args)
        return True


def _redact(value: Any) -> Any:
    return _TOKEN.sub(r"\1***", value) if isinstance(value, str) else value


def install_log_redaction() -> None:
    for name in ("uvicorn.access", "uvicorn.error"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())
