"""What the job routes and the Studio share: who owns a job, a job's card, starting a job.

A job belongs to the API key that made it: another key gets 404 for it, as if it did not exist.
A signed-in Studio session (the key holder's browser) owns its jobs as `studio`. Callers without
either (an open server, or `auth_scope=admin` where synthesis needs none) share one owner,
`anonymous`: their jobs are reachable by anyone who has the job's id (128 random bits) and no key,
never by a keyed caller, nor a keyed job by them.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

from starlette.requests import HTTPConnection

from app.http.auth import COOKIE, authenticator
from app.jobs import book
from app.jobs.model import Item, ItemOptions, Job
from app.jobs.runner import JobRunner
from app.protocols.schemas import ErrorInfo, JobCard, JobProgress, JobRequest, voice_id
from engines.base import InvalidParameter

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


def card(runner: JobRunner, job: Job, chapters: bool = False) -> JobCard:
    progress = runner.progress(job)
    request = job.request
    body = JobCard(
        id=job.id, kind=job.kind, status=job.status, created_at=int(job.created),
        finished_at=int(job.finished) if job.finished else None, title=request.get("title"),
        model=request.get("model"), response_format=request.get("response_format"),
        progress=JobProgress(**progress.json()),
        error=ErrorInfo(**job.error) if job.error else None,
    )
    if chapters:
        samples: dict[int, list[int | None]] = {}
        for segment in runner.store.segments(job.id):  # one query, however many chapters
            samples.setdefault(segment.item, []).append(segment.samples)
        body.chapters = [_chapter(job, item, samples.get(item.index, []))
                         for item in runner.store.items(job.id)]
    return body


def _chapter(job: Job, item: Item, samples: list[int | None]) -> dict[str, Any]:
    base = f"/v1/audio/jobs/{job.id}/chapters/{item.index + 1}"
    ready = item.error is None and bool(samples) and None not in samples
    seconds = sum(s or 0 for s in samples) / item.sample_rate if ready and item.sample_rate \
        else None
    return {"index": item.index + 1, "title": item.title, "chars": len(item.text),
            "ready": ready, "duration_s": seconds,
            "audio": base + "/audio" if ready else None,
            "captions": {"srt": base + "/captions?format=srt",
                         "vtt": base + "/captions?format=vtt"} if ready else None,
            "error": item.error}


def job_items(body: JobRequest) -> list[Item]:
    """A job request's chapters: its items, or its input read as text, Markdown or EPUB."""
    options = ItemOptions(model=body.model, voice=body.voice_id, speed=body.speed,
                          language=body.language, instructions=body.instructions,
                          response_format=body.response_format)
    if body.items is not None:
        if body.input is not None:
            raise InvalidParameter("Send 'input' or 'items', not both", param="items")
        return [Item(n, item.title or "", book.titled(item.title or "", item.input),
                     ItemOptions(body.model, voice_id(item.voice) or options.voice,
                                 item.speed or options.speed, item.language or options.language,
                                 options.instructions, options.response_format),
                     item.model_dump(exclude_none=True, mode="json"))
                for n, item in enumerate(body.items)]
    if body.input is None:
        raise InvalidParameter("'input' (a text, Markdown or an EPUB) or 'items' is required",
                               param="input")
    chapters = book.chapters(body.input, body.input_format, body.title)
    return [Item(n, c.title, c.text, options) for n, c in enumerate(chapters)]


async def start_job(runner: JobRunner, owner: str, body: JobRequest) -> Job:
    """Check, cut into chapters and segments, store and queue a job (the API's and the
    Studio's)."""
    items = await asyncio.to_thread(job_items, body)
    chars = sum(len(i.text) for i in items)
    limit = runner.settings.jobs_max_chars
    if chars > limit:
        raise InvalidParameter(f"The job's text is {chars} characters; the limit is {limit}",
                               param="input", code="string_above_max_length")
    return await runner.create(owner, "book", {
        "model": body.model, "voice": body.voice_id, "speed": body.speed,
        "response_format": body.response_format, "title": body.title,
        "input_format": body.input_format, "chars": chars}, items)
