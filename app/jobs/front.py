"""What the job routes and the Studio share: who owns a job, a job's card, starting a job.

A job belongs to the API key that made it: another key gets 404 for it, as if it did not exist.
A signed-in Studio session (the key holder's browser) owns its jobs as `studio`. Callers without
either (an open server, or `auth_scope=admin` where synthesis needs none) share one owner,
`anonymous`: their jobs are reachable by anyone who has the job's id (128 random bits) and no key,
never by a keyed caller, nor a keyed job by them.

A card reads the store's counts (and each item's summary), never the book's text nor every
segment; the routes build cards with `job_card`/`job_cards`, which read the store in a thread.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from typing import Any

from starlette.requests import HTTPConnection

from app.http.auth import COOKIE, authenticator
from app.jobs import book
from app.jobs.model import Item, ItemOptions, ItemSummary, Job
from app.jobs.runner import JobRunner
from app.jobs.store import Store
from app.protocols.schemas import ErrorInfo, JobCard, JobProgress, JobRequest, voice_id
from app.text.ssml import detect
from engines.base import InvalidParameter

Counts = tuple[int, int, float]

ANONYMOUS = "anonymous"
STUDIO = "studio"


def owner_of(request: HTTPConnection) -> str:
    """A key's digest; `studio` for a signed-in Studio session (the key holder's browser);
    else `anonymous`."""
    auth = authenticator(request)
    key = auth.presented_key(request)
    if key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]
    if auth.enabled and auth.session_valid(request.cookies.get(COOKIE)):
        return STUDIO
    return ANONYMOUS


async def job_card(runner: JobRunner, job: Job, chapters: bool = False) -> JobCard:
    """A job's card, the store read in a thread."""
    return (await job_cards(runner, [job], chapters))[0]


async def job_cards(runner: JobRunner, jobs: list[Job], chapters: bool = False
                    ) -> list[JobCard]:
    """Cards of `jobs`, the store read in one thread for all of them."""
    store = runner.store
    reads = await asyncio.to_thread(lambda: [_read(store, job.id, chapters) for job in jobs])
    return [_card(runner, job, *read) for job, read in zip(jobs, reads, strict=True)]


def _read(store: Store, job_id: str, chapters: bool) -> tuple[Counts, list[ItemSummary] | None]:
    return store.counts(job_id), store.summaries(job_id) if chapters else None


def _card(runner: JobRunner, job: Job, counts: Counts, summaries: list[ItemSummary] | None
          ) -> JobCard:
    progress = runner.progress(job, counts)
    request = job.request
    body = JobCard(
        id=job.id, kind=job.kind, status=job.status, created_at=int(job.created),
        finished_at=int(job.finished) if job.finished else None, title=request.get("title"),
        model=request.get("model"), response_format=request.get("response_format"),
        progress=JobProgress(**progress.json()),
        error=ErrorInfo(**job.error) if job.error else None,
    )
    if summaries is not None:
        body.chapters = [_chapter(job, summary) for summary in summaries]
    return body


def _chapter(job: Job, item: ItemSummary) -> dict[str, Any]:
    base = f"/v1/audio/jobs/{job.id}/chapters/{item.index + 1}"
    ready = item.ready
    return {"index": item.index + 1, "title": item.title, "chars": item.chars,
            "ready": ready, "duration_s": item.seconds,
            "audio": base + "/audio" if ready else None,
            "captions": {"srt": base + "/captions?format=srt",
                         "vtt": base + "/captions?format=vtt"} if ready else None,
            "error": item.error}


def job_items(body: JobRequest, budget: book.ArchiveBudget) -> list[Item]:
    """A job request's chapters: its items, or its input read as text, SSML (one chapter),
    Markdown or EPUB (an EPUB within `budget`). An item or text that is SSML (`<speak>`) is
    read as SSML, as on the speech route; its title is not spoken (the document is whole)."""
    options = ItemOptions(model=body.model, voice=body.voice_id, speed=body.speed,
                          language=body.language, instructions=body.instructions,
                          response_format=body.response_format)
    if body.items is not None:
        if body.input is not None:
            raise InvalidParameter("Send 'input' or 'items', not both", param="items")
        return [Item(n, item.title or "", item.input if detect(item.input)
                     else book.titled(item.title or "", item.input),
                     ItemOptions(body.model, voice_id(item.voice) or options.voice,
                                 item.speed or options.speed, item.language or options.language,
                                 options.instructions, options.response_format),
                     item.model_dump(exclude_none=True, mode="json"))
                for n, item in enumerate(body.items)]
    if body.input is None:
        raise InvalidParameter("'input' (a text, SSML, Markdown or an EPUB) or 'items' is "
                               "required", param="input")
    if body.input_format == "ssml" or (body.input_format == "text" and detect(body.input)):
        return [Item(0, body.title or "", body.input, replace(options, input_format="ssml"))]
    chapters = book.chapters(body.input, body.input_format, body.title, budget=budget)
    read_as = "text" if body.input_format in ("markdown", "epub") else None
    return [Item(n, c.title, c.text, replace(options, input_format=read_as))
            for n, c in enumerate(chapters)]


async def start_job(runner: JobRunner, owner: str, body: JobRequest, client: str) -> Job:
    """Read a job request's chapters (in a thread: an EPUB is inflated and parsed), then plan
    (with `client`'s lexicons), store and queue the job (the API's and the Studio's)."""
    settings = runner.settings
    items = await asyncio.to_thread(job_items, body, book.ArchiveBudget(
        settings.epub_max_bytes, settings.epub_max_entries))
    chars = sum(len(i.text) for i in items)
    return await runner.create(owner, "book", {
        "model": body.model, "voice": body.voice_id, "speed": body.speed,
        "response_format": body.response_format, "title": body.title,
        "input_format": body.input_format, "chars": chars}, items, client)
