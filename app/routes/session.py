"""Browser sessions: `POST /v1/auth/session` trades a key for an HttpOnly cookie, `DELETE` ends it.

The Studio uses this, so the key never has to live in page script or local storage.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.http.auth import COOKIE, MESSAGE, authenticator
from app.http.errors import InvalidApiKey
from app.protocols.schemas import ERROR_RESPONSES, SessionRequest

router = APIRouter(tags=["auth"])


@router.get("/v1/auth/session")
async def session_state(request: Request) -> dict[str, object]:
    auth = authenticator(request)
    return {
        "auth_required": auth.enabled,
        "scope": auth.scope if auth.enabled else None,
        "authenticated": auth.authorized(request),
    }


@router.post("/v1/auth/session", responses=ERROR_RESPONSES)
async def open_session(body: SessionRequest, request: Request) -> JSONResponse:
    auth = authenticator(request)
    if not auth.enabled:
        return JSONResponse({"authenticated": True, "auth_required": False})
    key = auth.match(body.key)
    if key is None:
        raise InvalidApiKey(MESSAGE)
    cookie, expires = auth.open_session(key)
    response = JSONResponse(
        {"authenticated": True, "auth_required": True, "expires_at": expires}
    )
    response.set_cookie(
        COOKIE, cookie, max_age=int(auth.session_ttl), path="/", httponly=True,
        samesite="strict", secure=request.url.scheme == "https",
    )
    return response


@router.delete("/v1/auth/session")
async def close_session(request: Request) -> JSONResponse:
    authenticator(request).close_session(request.cookies.get(COOKIE))
    response = JSONResponse({"authenticated": False})
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return response
