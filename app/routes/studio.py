"""The Studio: `GET /` and its htmx fragments, which are named blocks of `studio.html`.

`POST` routes answer only htmx (they need its `HX-Request` header, which a cross-site form
cannot send) and reply with the block they changed. Auth follows the API's scopes: admin
fragments and actions need a signed-in session, synthesis does under scope `all`; otherwise the
block says how to sign in instead of failing.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, File, Form, Request, UploadFile
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError

from app.http.clients import client_id
from app.http.deps import ClientDep, RequestIdDep, ServiceDep
from app.http.errors import kind_of
from app.jobs import book
from app.jobs.front import job_cards, owner_of, start_job
from app.jobs.runner import JobRunner
from app.protocols.schemas import JobRequest
from app.resources import STATIC, TEMPLATES
from app.routes import studio_audio
from app.serving.lexicons import owner_of as lexicon_owner
from app.serving.service import SpeechService
from app.studio import lexicon
from app.studio.audition import COMPARE_MAX, compare
from app.studio.blend import editor, mix, parse_rows
from app.studio.deps import ClipsDep, PagesDep, access, from_htmx
from app.studio.templating import Pages
from app.studio.view import (
    FORMATS,
    GENDERS,
    KINDS,
    Filters,
    all_voices,
    languages,
    model_rows,
    named_voices,
    open_clip_store,
    parse_keys,
    synthesize,
    voice_view,
)
from engines.base import VoxMuxError

HTMX = "htmx-2.0.11.min.js"
PAGE = "studio.html"
FRAGMENTS = ("auth", "models", "voices", "stats", "requests", "compare", "blend", "blend_mix",
             "jobs", "lexicons")
JOBS_SHOWN = 10
CHAPTERS_SHOWN = 30
STOP_POLLING = 286
"""htmx stops polling an element whose response has this status (the jobs panel, when no job of
the caller is queued or running)."""
RECENT_REQUESTS = 20

router = APIRouter(tags=["studio"], include_in_schema=False)


async def _context(request: Request, service: SpeechService, blocks: tuple[str, ...],
                   **extra: Any) -> dict[str, Any]:
    allowed = access(request)
    query = request.query_params
    ctx: dict[str, Any] = {
        "access": allowed,
        "htmx": HTMX,
        "formats": FORMATS,
        "genders": GENDERS,
        "kinds": KINDS,
        "compare_max": COMPARE_MAX,
        "max_input_chars": service.settings.max_input_chars,
        "model_ids": [h.id for h in service.models()],
        "default_voices": {h.id: h.entry.default_voice for h in service.models()},
    }
    if allowed.listing and "models" in blocks:
        ctx["models"] = model_rows(service, await service.model_views())
    if allowed.listing and "voices" in blocks:
        filters = Filters(
            model=query.get("model", ""), language=query.get("language", ""),
            gender=query.get("gender", ""), query=query.get("q", ""),
            kind=query.get("kind", ""),
        )
        ctx["filters"] = filters
        ctx["languages"] = languages(all_voices(service))
        ctx["voices"] = voice_view(service, filters, parse_keys(query.get("fav", "")),
                                   parse_keys(query.get("recent", "")),
                                   parse_keys(query.get("cmp", "")))
    if allowed.listing and "compare" in blocks:
        ctx["picked"] = named_voices(service, parse_keys(query.get("cmp", ""))[:COMPARE_MAX])
    if allowed.listing and {"blend", "blend_mix"} & set(blocks):
        ctx["blend"] = blend_editor = editor(service, query.get("model", ""))
        if blend_editor is not None:
            rows = (parse_rows(query.getlist("voice"), query.getlist("weight"))
                    if "voice" in query else blend_editor.rows)
            ctx["mix"] = await mix(service, blend_editor.model, rows)
    if allowed.synthesis and "jobs" in blocks:
        runner: JobRunner = request.app.state.jobs
        ctx["chapters_shown"] = CHAPTERS_SHOWN
        if runner.unavailable is None:
            jobs = await asyncio.to_thread(runner.store.jobs, owner_of(request))
            ctx["jobs"] = await job_cards(runner, jobs[-JOBS_SHOWN:][::-1], chapters=True)
        else:
            ctx.setdefault("job_notice", runner.unavailable)
            ctx.setdefault("job_error", True)
    if allowed.synthesis and "lexicons" in blocks:
        ctx["lexicons"] = await asyncio.to_thread(service.lexicons.list,
                                                  lexicon_owner(client_id(request)))
        ctx["lexicon_name"] = lexicon.DEFAULT_NAME
    if allowed.admin and "stats" in blocks:
        ctx["stats"] = await service.report()
    if allowed.admin and "requests" in blocks:
        ctx["requests"] = service.stats.requests(service.queue_position)[:RECENT_REQUESTS]
    ctx.update(extra)
    return ctx


def _block(pages: Pages, block: str, ctx: dict[str, Any], status: int = 200) -> HTMLResponse:
    return HTMLResponse(pages.block(PAGE, block, ctx), status_code=status)


@router.get("/", response_class=HTMLResponse)
async def studio_page(request: Request, service: ServiceDep, pages: PagesDep) -> HTMLResponse:
    ctx = await _context(request, service, (*FRAGMENTS, "result", "comparison", "trial"))
    return HTMLResponse(pages.page(PAGE, ctx))


@router.get("/studio/fragments/{block}", response_class=HTMLResponse)
async def fragment(block: str, request: Request, service: ServiceDep,
                   pages: PagesDep) -> HTMLResponse:
    if block not in FRAGMENTS:
        return HTMLResponse(f"No Studio fragment named {block!r}", status_code=404)
    ctx = await _context(request, service, (block,))
    active = any(job.status in ("queued", "running") for job in ctx.get("jobs", []))
    return _block(pages, block, ctx, 200 if block != "jobs" or active else STOP_POLLING)


@router.post("/studio/jobs", response_class=HTMLResponse, dependencies=[Depends(from_htmx)])
async def start_studio_job(
    request: Request,
    service: ServiceDep,
    pages: PagesDep,
    model: Annotated[str, Form()],
    text: Annotated[str, Form()] = "",
    file: Annotated[UploadFile | None, File()] = None,
    title: Annotated[str, Form()] = "",
    voice: Annotated[str, Form()] = "",
    format: Annotated[str, Form()] = "mp3",
    input_format: Annotated[str, Form()] = "text",
) -> HTMLResponse:
    """A book from the textarea or an uploaded file (`.epub`, `.md`, text), as a job."""
    if not access(request).synthesis:
        ctx = await _context(request, service, ("jobs",), job_notice="Sign in with an API key "
                             "to start a job.", job_error=True)
        return _block(pages, "jobs", ctx, 401)
    status, notice = 200, None
    try:
        source, fmt = text, input_format
        if file is not None and file.filename:
            data = await file.read()
            source, fmt = book.upload(file.filename, data)
        body = JobRequest.model_validate({
            "model": model, "voice": voice.strip() or None, "input": source,
            "input_format": fmt, "response_format": format,
            "title": title.strip() or (file.filename if file is not None else None) or None})
        job = await start_job(request.app.state.jobs.available(), owner_of(request), body,
                              client_id(request))
        notice = f"Started {job.id}."
    except ValidationError as exc:
        status, notice = 400, "; ".join(str(e["msg"]) for e in exc.errors())
    except VoxMuxError as exc:
        status, notice = kind_of(exc).status, exc.message
    ctx = await _context(request, service, ("jobs",), job_notice=notice, job_error=status >= 400)
    return _block(pages, "jobs", ctx, status)


@router.post("/studio/jobs/{job_id}/cancel", response_class=HTMLResponse,
             dependencies=[Depends(from_htmx)])
async def cancel_studio_job(job_id: str, request: Request, service: ServiceDep,
                            pages: PagesDep) -> HTMLResponse:
    runner: JobRunner = request.app.state.jobs
    job = (await asyncio.to_thread(runner.store.job, job_id)
           if runner.unavailable is None else None)
    if job is not None and job.owner == owner_of(request) and access(request).synthesis:
        await runner.cancel(job)
    ctx = await _context(request, service, ("jobs",))
    return _block(pages, "jobs", ctx)


@router.post("/studio/models/{model_id}/{action}", response_class=HTMLResponse,
             dependencies=[Depends(from_htmx)])
async def model_action(model_id: str, action: Literal["load", "unload", "switch"],
                       request: Request, service: ServiceDep, pages: PagesDep) -> HTMLResponse:
    if not access(request).admin:
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


@router.post("/studio/generate", response_class=HTMLResponse, dependencies=[Depends(from_htmx)])
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
    if not access(request).synthesis:
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


@router.post("/studio/compare", response_class=HTMLResponse, dependencies=[Depends(from_htmx)])
async def compare_voices(
    request: Request,
    service: ServiceDep,
    pages: PagesDep,
    clips: ClipsDep,
    request_id: RequestIdDep,
    client: ClientDep,
    text: Annotated[str, Form()] = "",
    pick: Annotated[list[str] | None, Form()] = None,
    speed: Annotated[float, Form()] = 1.0,
    format: Annotated[str, Form()] = "mp3",
) -> HTMLResponse:
    """The same text in each picked voice (`pick`: `model:voice`, two to four), side by side."""
    if not access(request).synthesis:
        ctx = await _context(request, service, ("comparison",),
                             error="Sign in with an API key to synthesize speech.", auth_hint=True)
        return _block(pages, "comparison", ctx, 401)
    try:
        contenders = await compare(service, parse_keys(",".join(pick or [])), text=text,
                                   speed=speed, fmt=format, request_id=request_id,
                                   client=client, request=request)
    except VoxMuxError as exc:
        ctx = await _context(request, service, ("comparison",), error=exc.message)
        return _block(pages, "comparison", ctx, kind_of(exc).status)
    stored = [c.clip is not None and await clips.put(c.clip) for c in contenders]
    ctx = await _context(request, service, ("comparison",), contenders=contenders, text=text,
                         stored=stored)
    return _block(pages, "comparison", ctx)


@router.post("/studio/lexicon/try", response_class=HTMLResponse,
             dependencies=[Depends(from_htmx)])
async def try_reading(
    request: Request,
    service: ServiceDep,
    pages: PagesDep,
    clips: ClipsDep,
    request_id: RequestIdDep,
    client: ClientDep,
    word: Annotated[str, Form()],
    reading: Annotated[str, Form()],
    model: Annotated[str, Form()],
    text: Annotated[str, Form()] = "",
    voice: Annotated[str, Form()] = "",
    language: Annotated[str, Form()] = "en",
) -> HTMLResponse:
    """The word (or a sentence with it) as read now and with `reading`, side by side."""
    if not access(request).synthesis:
        ctx = await _context(request, service, ("trial",),
                             error="Sign in with an API key to hear readings.", auth_hint=True)
        return _block(pages, "trial", ctx, 401)
    try:
        trial = await lexicon.trial(service, word=word, reading=reading, text=text, model=model,
                                    voice=voice.strip(), language=language,
                                    request_id=request_id, client=client, request=request)
    except VoxMuxError as exc:
        ctx = await _context(request, service, ("trial",), error=exc.message)
        return _block(pages, "trial", ctx, kind_of(exc).status)
    for clip in (trial.now, trial.after):
        await clips.put(clip)
    ctx = await _context(request, service, ("trial",), trial=trial)
    return _block(pages, "trial", ctx)


@router.post("/studio/lexicon/{action}", response_class=HTMLResponse,
             dependencies=[Depends(from_htmx)])
async def edit_lexicon(
    action: Literal["save", "remove"],
    request: Request,
    service: ServiceDep,
    pages: PagesDep,
    client: ClientDep,
    word: Annotated[str, Form()],
    reading: Annotated[str, Form()] = "",
    language: Annotated[str, Form()] = "en",
    name: Annotated[str, Form()] = lexicon.DEFAULT_NAME,
) -> HTMLResponse:
    """Save the word's reading into a lexicon, or remove the word from one."""
    if not access(request).synthesis:
        ctx = await _context(request, service, ("lexicons",), lexicon_notice="Sign in with an "
                             "API key to edit pronunciations.", lexicon_error=True)
        return _block(pages, "lexicons", ctx, 401)
    status, notice = 200, None
    owner = lexicon_owner(client)
    try:
        if action == "save":
            await asyncio.to_thread(lexicon.save, service.lexicons, owner, word=word,
                                    reading=reading, language=language, name=name)
            notice = f"Saved: {word.strip()} reads {reading.strip()}."
        else:
            await asyncio.to_thread(lexicon.remove, service.lexicons, owner, name=name,
                                    word=word)
            notice = f"Removed {word} from {name}."
    except VoxMuxError as exc:
        status, notice = kind_of(exc).status, exc.message
    ctx = await _context(request, service, ("lexicons",), lexicon_notice=notice,
                         lexicon_error=status >= 400)
    return _block(pages, "lexicons", ctx, status)


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
    app.include_router(studio_audio.router)
