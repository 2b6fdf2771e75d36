"""Who is asking: the unit a model's places and the WebSocket connections are shared out by.

A client is the API key it presents (as a digest: the key itself is never kept or shown), else its
remote address. Behind a reverse proxy, uvicorn takes the client's address from the proxy's
`X-Forwarded-For` when the proxy connects from an address in `FORWARDED_ALLOW_IPS` (by default
127.0.0.1 and ::1); a proxy elsewhere must be named there, or every request counts as one client.
"""

from __future__ import annotations

import hashlib

from starlette.requests import HTTPConnection

from app.http.auth import authenticator


def client_id(conn: HTTPConnection) -> str:
    auth = authenticator(conn)
    websocket = conn.scope["type"] == "websocket"
    key = auth.presented_key(conn, query_token=websocket)
    if key is not None:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:12]
    return "addr:" + (conn.client.host if conn.client else "unknown")
