"""Security headers on every HTTP response.

The Studio's page runs only its own files: no inline script, style or handler, no `eval` (htmx
is told not to use it and not to inject its indicator `<style>`), so its policy names nothing but
'self'. WebSockets to the page's own host count as 'self' for `connect-src` (CSP Level 3).
Nothing may frame any response (clickjacking of the admin buttons), no response is sniffed as
another type, and no URL leaves in a `Referer` for another origin.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STUDIO_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "media-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])
"""For HTML and the Studio's static files."""
API_POLICY = "frame-ancestors 'none'"
"""For everything else (JSON, audio): nothing to run, and never framed."""

BASE_HEADERS: dict[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def policy_for(path: str, content_type: str) -> str:
    if content_type.startswith("text/html") or path.startswith("/static/"):
        return STUDIO_POLICY
    return API_POLICY


def raw_headers(policy: str = API_POLICY) -> list[tuple[bytes, bytes]]:
    """The headers as bytes, for responses written below the ASGI app."""
    pairs = {**BASE_HEADERS, "Content-Security-Policy": policy}
    return [(name.lower().encode(), value.encode()) for name, value in pairs.items()]


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in BASE_HEADERS.items():
                    headers.setdefault(name, value)
                policy = policy_for(scope["path"], headers.get("content-type", ""))
                headers.setdefault("Content-Security-Policy", policy)
            await send(message)

        await self.app(scope, receive, send_with_headers)
