"""What the Studio's routes share: who may see and do what, and typed dependencies over the
Studio's state (its templates and its clip store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from app.http.auth import authenticator
from app.studio.templating import Pages
from app.studio.view import ClipStore
from engines.base import InvalidParameter


@dataclass(frozen=True)
class Access:
    required: bool
    scope: str
    signed_in: bool
    """Authorized by the session cookie (always true on an open server)."""

    @property
    def listing(self) -> bool:
        return self.signed_in or self.scope != "all"

    synthesis = listing

    @property
    def admin(self) -> bool:
        return self.signed_in


def access(request: Request) -> Access:
    auth = authenticator(request)
    return Access(auth.enabled, auth.scope, auth.authorized(request))


async def from_htmx(request: Request) -> None:
    """Studio POSTs need htmx's `HX-Request` header, which a cross-site form cannot send."""
    if request.headers.get("hx-request") != "true":
        raise InvalidParameter("Studio actions are sent by the Studio page (htmx) only")


async def _pages(request: Request) -> Pages:
    pages: Pages = request.app.state.studio_pages
    return pages


async def _clips(request: Request) -> ClipStore:
    clips: ClipStore = request.app.state.studio_clips
    return clips


PagesDep = Annotated[Pages, Depends(_pages)]
ClipsDep = Annotated[ClipStore, Depends(_clips)]
