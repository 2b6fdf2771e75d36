"""The Studio: `GET /` and its htmx fragments, which are named blocks of `studio.html`.

`POST` routes answer only htmx (they need its `HX-Request` header, which a cross-site form
cannot send) and reply with the block they changed. Auth follows the API's scopes: admin
fragments and actions need a signed-in session, synthesis does under scope `all`; otherwise the
block says how to sign in instead of failing.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Form, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles

from app.http.auth import authenticator
from app.http.deps import ClientDep, RequestIdDep, ServiceDep
from app.http.errors import kind_of
from app.resources import STATIC, TEMPLATES
from app.serving.service import SpeechService
from app.studio.templating import Pages
from app.studio.view import (
    FORMATS,
    GENDERS,
    ClipStore,
    Filters,
    all_voices,
    languages,
    model_rows,
    open_clip_store,
    parse_keys,
    synthesize,
    voice_view,
)
from engines.base import InvalidParameter, VoxMuxError

HTMX = "htmx-2.0.11.min.js"
PAGE = "studio.html"
FRAGMENTS = ("auth", "models", "voices", "stats", "requests")
RECENT_REQUESTS = 20

router = APIRouter(tags=["studio"], include_in_schema=False)


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


def _access(request: Request) -> Access:
    auth = authenticator(request)
    return Access(auth.enabled, auth.scope, auth.authorized(request))


def _from_htmx(request: Request) -> None:
    if request.headers.get("hx-request") != "true":
        raise InvalidParameter("Studio actions are sent by the Studio page (htmx) only")


def _pages(request: Request) -> Pages:
    pages: Pages = request.app.state.studio_pages
    return pages


def _clips(request: Request) -> ClipStore:
    clips: ClipStore = request.app.state.studio_clips
    return clips


PagesDep = Annotated[Pages, Depends(_pages)]
ClipsDep = Annotated[ClipStore, Depends(_clips)]


async def _context(request: Request, service: SpeechService, blocks: tuple[str, ...],
                   **extra: Any) -> dict[str, Any]:
    access = _access(request)
    ctx: dict[str, Any] = {
        "access": access,
        "htmx": HTMX,
        "formats": FORMATS,
        "genders": GENDERS,
        "max_input_chars": service.settings.max_input_chars,
        "model_ids": [h.id for h in service.models()],
        "default_voices": {h.id: h.entry.default_voice for h in service.models()},
    }
    if access.listing and "models" in blocks:
        ctx["models"] = model_rows(service, await service.model_views())
    if access.listing and "voices" in blocks:
        query = request.query_params
        filters = Filters(
            model=query.get("model", ""), language=query.get("language", ""),
            gender=query.get("gender", ""), query=query.get("q", ""),
        )
        ctx["filters"] = filters
        ctx["languages"] = languages(all_voices(service))
        ctx["voices"] = voice_view(service, filters, parse_keys(query.get("fav", "")),
                                   parse_keys(query.get("recent", "")))
    if access.admin and "stats" in blocks:
        ctx["stats"] = await service.report()
    if access.admin and "requests" in blocks:
        ctx["requests"] = service.stats.requests(service.queue_position)[:RECENT_REQUESTS]
    ctx.update(extra)
    return ctx


def _block(pages: Pages, block: str, ctx: dict[str, Any], status: int = 200) -> HTMLResponse:
    return HTMLResponse(pages.block(PAGE, block, ctx), status_code=status)


@router.get("/", response_class=HTMLResponse)
async def studio_page(request: Request, service: ServiceDep, pages: PagesDep) -> HTMLResponse:
    ctx = await _context(request, service, (*FRAGMENTS, "result"))
    return HTMLResponse(pages.page(PAGE, ctx))


@router.get("/studio/fragments/{block}", response_class=HTMLResponse)
async def fragment(block: str, request: Request, service: ServiceDep,
                   pages: PagesDep) -> HTMLResponse:
    if block not in FRAGMENTS:
        return HTMLResponse(f"No Studio fragment named {block!r}", status_code=404)
    return _block(pages, block, await _context(request, service, (block,)))


@router.post("/studio/models/{model_id}/{action}", response_class=HTMLResponse,
             dependencies=[Depends(_from_htmx)])
async def model_action(model_id: str, action: Literal["load", "unload", "switch"],
                       request: Request, service: ServiceDep, pages: PagesDep) -> HTMLResponse:
    if not _access(request).admin:
        hint = "Sign in with an API key to load, unload or switch models."
        ctx = await _context(request, service, ("models",), notice=hint, notice_error=True)
        return _block(pages, "models", ctx, 401)
    status = 200
    notice: str | None = None
    try:
        handle = service.registry.resolve(model_id)
        if action == "load":
            await service.load_model(handle.id)
        elif action == "unload":
            await service.unload_model(handle.id)
        else:
            result = await service.switch_model(handle.id, unload_previous=True)
            if result.previous_busy:
                notice = f"Switched to {handle.id}; {result.previous} is busy and stays loaded."
    except VoxMuxError as exc:
        status, notice = kind_of(exc).status, exc.message
    ctx = await _context(request, service, ("models",), notice=notice, notice_error=status >= 400)
    return _block(pages, "models", ctx, status)


@router.post("/studio/generate", response_class=HTMLResponse, dependencies=[Depends(_from_htmx)])
async def generate(
    request: Request,
    service: ServiceDep,
    pages: PagesDep,
    clips: ClipsDep,
    request_id: RequestIdDep,
    client: ClientDep,
    model: Annotated[str, Form()],
    text: Annotated[str, Form()] = "",
    voice: Annotated[str, Form()] = "",
    speed: Annotated[float, Form()] = 1.0,
    format: Annotated[str, Form()] = "mp3",
) -> HTMLResponse:
    if not _access(request).synthesis:
        ctx = await _context(request, service, ("result",),
                             error="Sign in with an API key to synthesize speech.", auth_hint=True)
        return _block(pages, "result", ctx, 401)
    try:
        clip = await synthesize(service, model=model, text=text, voice=voice.strip(),
                                speed=speed, fmt=format, request_id=request_id, client=client,
                                request=request)
    except VoxMuxError as exc:
        ctx = await _context(request, service, ("result",), error=exc.message)
        return _block(pages, "result", ctx, kind_of(exc).status)
    stored = await clips.put(clip)
    ctx = await _context(request, service, ("result",), clip=clip, stored=stored)
    return _block(pages, "result", ctx)


_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@router.get("/studio/audio/{clip_id}")
async def clip_audio(clip_id: str, request: Request, clips: ClipsDep) -> Response:
    clip = await clips.get(clip_id)
    if clip is None or not _access(request).synthesis:
        return Response("This clip is gone; generate it again.", status_code=404,
                        media_type="text/plain")
    headers = {
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'inline; filename="{clip.filename}"',
        "Cache-Control": "private, max-age=3600",
    }
    size = len(clip.data)
    # Browsers ask for byte ranges to seek in audio; one range is all they send.
    match = _RANGE.fullmatch(request.headers.get("range", "").strip())
    if match is None or not (match[1] or match[2]):
        return Response(clip.data, media_type=clip.content_type, headers=headers)
    if match[1]:
        start, end = int(match[1]), min(int(match[2] or size - 1), size - 1)
    else:
        start, end = max(size - int(match[2]), 0), size - 1
    if start > end:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return Response(clip.data[start:end + 1], status_code=206, media_type=clip.content_type,
                    headers=headers)


def _clock(timestamp: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(timestamp))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")


def install(app: FastAPI) -> None:
    """Serve the Studio at `/` and its files at `/static`."""
    pages = Pages(TEMPLATES)
    pages.env.filters["clock"] = _clock
    pages.env.filters["slug"] = _slug
    app.state.studio_pages = pages
    app.state.studio_clips = open_clip_store(app.state.settings.cache_url)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.include_router(router)
