"""What the job routes and the Studio share: who owns a job, reading a job request, a job's card,
starting a job.

A job belongs to the API key that made it: another key gets 404 for it, as if it did not exist.
A signed-in Studio session (the key holder's browser) owns its jobs as `studio`. Callers without
either (an open server, or `auth_scope=admin` where synthesis needs none) share one owner,
`anonymous`: their jobs are reachable by anyone who has the job's id (128 random bits) and no key,
never by a keyed caller, nor a keyed job by them.

A job request is read in a worker thread, and what it may cost is counted before it is parsed
whole (`parse_job_request`): parsing JSON into objects holds the interpreter's lock for as long
as it takes (a 30 MB array of numbers: seconds), so its items, values and texts are first counted
by ijson, a piece of the body at a time, and a request with more items than
`batch_max_job_items`, more JSON values than such items could hold, or a text longer than
`jobs_max_chars` stops there.

A card reads the store's counts (and each item's summary), never the book's text nor every
segment; cards are read, built and (for the routes) serialized in one worker thread, the JSON a
piece at a time (`card_json`), so a card of many thousands of chapters never holds the loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import replace
from typing import Any, TypeVar

import ijson
from pydantic import BaseModel, ValidationError
from starlette.requests import HTTPConnection

from app.http.auth import COOKIE, authenticator
from app.http.errors import describe_validation_error
from app.jobs import book
from app.jobs.model import BOOK_FORMAT, Item, ItemOptions, ItemSummary, Job, JobNotFound
from app.jobs.results import COVER_NAME
from app.jobs.runner import JobRunner
from app.protocols.schemas import ErrorInfo, JobCard, JobRequest, voice_id
from app.serving.budgets import OverBudget, env_name
from app.text.ssml import detect
from engines.base import InvalidParameter

Counts = tuple[int, int, float]
M = TypeVar("M", bound=BaseModel)

ANONYMOUS = "anonymous"
STUDIO = "studio"

VALUES_PER_ITEM = 32
"""JSON values (objects, arrays, members) a job request may hold for each item it may have: an
item with every field and a voice object holds about 15."""
_TEXTS = {"input", "text", "items.item.input", "items.item.text"}
"""Where a job request's texts are (`text` is an alias of `input`)."""
_SCALARS = ("string", "number", "boolean", "null", "start_map", "start_array")
"""ijson's events that begin a value."""
CHUNK_BYTES = 64 * 1024
"""Bytes of a request ijson reads at a time."""

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


# -- reading a request ---------------------------------------------------------------------------

def too_many_items(count: int | None, limit: int) -> OverBudget:
    amount = f"{count:,}" if count is not None else f"more than {limit:,}"
    return OverBudget("The request's items", amount, f"{limit:,}", env_name("batch_max_job_items"),
                      param="items", hint="split them into several jobs")


def parse_job_request(raw: bytes | bytearray, max_items: int, max_chars: int) -> JobRequest:
    """A `POST /v1/audio/jobs` body as a `JobRequest` (`parse_request`)."""
    body = parse_request(JobRequest, raw, max_items, max_chars)
    if body.items is not None and len(body.items) > max_items:
        raise too_many_items(len(body.items), max_items)
    return body


def parse_request(model: type[M], raw: bytes | bytearray, max_items: int, max_chars: int) -> M:
    """A long-form request's body (a job, a batch) as `model`: what it may cost counted first
    (`count_request`), then parsed and validated; invalid is the 400 every route answers.
    Blocking (a second for the largest body): run it in a worker thread."""
    count_request(raw, max_items, VALUES_PER_ITEM * (max_items + 8), max_chars)
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first: dict[str, Any] = dict(exc.errors(include_url=False, include_input=False)[0])
        param, message = describe_validation_error(first)
        raise InvalidParameter(message, param=param, code=first.get("type")) from None


class _Pieces:
    """A body read a piece at a time, without a copy of the whole (`io.BytesIO` makes one)."""

    def __init__(self, raw: bytes | bytearray) -> None:
        self._view = memoryview(raw)
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._view) if size < 0 else self._at + size
        piece = bytes(self._view[self._at:end])
        self._at += len(piece)
        return piece


def count_request(raw: bytes | bytearray, max_items: int, max_values: int, max_chars: int
                  ) -> None:
    """`OverBudget` at the first value past `max_items` items, `max_values` JSON values, or,
    unless the input is an EPUB, `max_chars` characters of text; read by ijson's events, a
    piece of the body at a time, so no step holds the interpreter's lock long. Invalid JSON is
    left for the parser to describe."""
    items = values = chars = 0
    epub = False
    try:
        for prefix, event, value in ijson.parse(_Pieces(raw), buf_size=CHUNK_BYTES):
            if event not in _SCALARS:
                continue
            values += 1
            if values > max_values:
                raise OverBudget("The request's JSON", f"more than {max_values:,} values",
                                 f"{max_values:,} values ({VALUES_PER_ITEM} for each item a "
                                 "job may have)", env_name("batch_max_job_items"), param=None)
            if prefix == "items.item":
                items += 1
                if items > max_items:
                    raise too_many_items(None, max_items)
            elif event == "string" and prefix in _TEXTS:
                chars += len(value)
            elif event == "string" and prefix == "input_format":
                epub = value == "epub"
    except ijson.JSONError:
        return
    if chars > max_chars and not epub:
        raise book.too_long(max_chars, chars)


# -- cards ---------------------------------------------------------------------------------------

async def job_card(runner: JobRunner, job: Job, chapters: bool = False) -> JobCard:
    """A job's card, the store read and the card built in a thread."""
    return (await job_cards(runner, [job], chapters))[0]


async def job_cards(runner: JobRunner, jobs: list[Job], chapters: bool = False
                    ) -> list[JobCard]:
    """Cards of `jobs`, the store read and the cards built in one thread for all of them."""
    return await asyncio.to_thread(
        lambda: [JobCard.model_validate(card_body(runner, job, chapters)) for job in jobs])


async def card_payload(runner: JobRunner, job: Job, chapters: bool = False) -> dict[str, Any]:
    """A job's card as JSON-ready values, read and built in a thread."""
    return await asyncio.to_thread(card_body, runner, job, chapters)


async def card_json(runner: JobRunner, job: Job, chapters: bool = False) -> bytes:
    """A job's card as the JSON a route answers, read, built and serialized in a thread, its
    chapters a page at a time (`CHAPTERS_PAGE`): only their JSON is kept."""

    def build() -> bytes:
        head = _json(card_body(runner, job, False))  # ends `"chapters":null}`
        if not chapters:
            return head
        pages, start = [], 0
        while page := runner.store.summaries(job.id, start, CHAPTERS_PAGE):
            pages.append(b",".join(_json(_chapter(job, summary)) for summary in page))
            start = page[-1].index + 1
        return head[:-len(b"null}")] + b"[" + b",".join(pages) + b"]}"

    return await asyncio.to_thread(build)


async def list_json(runner: JobRunner, owner: str, limit: int, after: str | None) -> bytes:
    """A page of the owner's jobs, newest first, as OpenAI lists things (`data`, `first_id`,
    `last_id`, `has_more`); `after`: the last job of the page before. Read, built and serialized
    in a thread."""
    store = runner.store

    def page() -> bytes:
        if after is not None:
            anchor = store.job(after)
            if anchor is None or anchor.owner != owner:
                raise JobNotFound(f"No job '{after}'", param="after")
        jobs = store.recent(owner, limit + 1, after)
        cards = [_json(card_body(runner, job, False)) for job in jobs[:limit]]
        head = json.dumps({"object": "list"}, separators=(",", ":"))[:-1]
        tail = json.dumps({"first_id": jobs[0].id if jobs else None,
                           "last_id": jobs[:limit][-1].id if jobs else None,
                           "has_more": len(jobs) > limit}, separators=(",", ":"))[1:]
        return (f'{head},"data":['.encode() + b",".join(cards) + b"]," + tail.encode())

    return await asyncio.to_thread(page)


CHAPTERS_PAGE = 1000
"""A card's chapters are read and written this many at a time: a card of 100,000 chapters held
whole made the garbage collector walk them all (0.2 s holding every thread)."""


def card_body(runner: JobRunner, job: Job, chapters: bool) -> dict[str, Any]:
    """A job's card (`JobCard`'s fields, in its order) from the store's counts and, with
    `chapters`, each item's summary. Blocking."""
    store = runner.store
    counts = store.counts(job.id)
    summaries = store.summaries(job.id) if chapters else None
    request = job.request
    return {
        "id": job.id, "object": "audio.job", "kind": job.kind, "status": job.status,
        "created_at": int(job.created),
        "finished_at": int(job.finished) if job.finished else None,
        "title": request.get("title"), "model": request.get("model"),
        "response_format": request.get("response_format"),
        "progress": runner.progress(job, counts).json(),
        "error": ErrorInfo(**job.error).model_dump() if job.error else None,
        "chapters": None if summaries is None else [_chapter(job, s) for s in summaries],
    }


def _json(value: Any) -> bytes:
    """`value` as JSON, as Starlette's JSONResponse writes it."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode()


def _chapter(job: Job, item: ItemSummary) -> dict[str, Any]:
    base = f"/v1/audio/jobs/{job.id}/chapters/{item.index + 1}"
    ready = item.ready
    return {"index": item.index + 1, "title": item.title, "chars": item.chars,
            "ready": ready, "duration_s": item.seconds,
            "audio": base + "/audio" if ready else None,
            "captions": {"srt": base + "/captions?format=srt",
                         "vtt": base + "/captions?format=vtt"} if ready else None,
            "error": item.error}


# -- starting a job ------------------------------------------------------------------------------

def chapter_format(fmt: str) -> str:
    """The format of each chapter alone: an audiobook's chapters are its AAC."""
    return "aac" if fmt == BOOK_FORMAT else fmt


def job_items(body: JobRequest, budget: book.ArchiveBudget, max_chars: int,
              max_items: int) -> list[Item]:
    """A job request's chapters: its items, or its input read as text, SSML (one chapter),
    Markdown or EPUB (an EPUB within `budget`). An item or text that is SSML (`<speak>`) is
    read as SSML, as on the speech route; its title is not spoken (the document is whole).
    `OverBudget` past `max_chars` characters of text (counted before anything is tidied or
    parsed; an EPUB's as it is read) or `max_items` items or chapters."""
    options = ItemOptions(model=body.model, voice=body.voice_id, speed=body.speed,
                          language=body.language, instructions=body.instructions,
                          response_format=chapter_format(body.response_format))
    if body.items is not None:
        if body.input is not None:
            raise InvalidParameter("Send 'input' or 'items', not both", param="items")
        if len(body.items) > max_items:
            raise too_many_items(len(body.items), max_items)
        chars = sum(len(item.input) for item in body.items)
        if chars > max_chars:
            raise book.too_long(max_chars, chars)
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
    if body.input_format != "epub" and len(body.input) > max_chars:
        raise book.too_long(max_chars, len(body.input))
    if body.input_format == "ssml" or (body.input_format == "text" and detect(body.input)):
        return [Item(0, body.title or "", body.input, replace(options, input_format="ssml"))]
    chapters = book.chapters(body.input, body.input_format, body.title, budget=budget,
                             max_chars=max_chars)
    if len(chapters) > max_items:
        raise OverBudget("The book's chapters", f"{len(chapters):,}", f"{max_items:,}",
                         env_name("batch_max_job_items"), hint="split the book into several "
                         "jobs")
    read_as = "text" if body.input_format in ("markdown", "epub") else None
    return [Item(n, c.title, c.text, replace(options, input_format=read_as))
            for n, c in enumerate(chapters)]


async def start_job(runner: JobRunner, owner: str, body: JobRequest, client: str,
                    extra: dict[str, Any] | None = None) -> Job:
    """Read a job request's chapters (in a thread: an EPUB is inflated and parsed), then plan
    (with `client`'s lexicons), store and queue the job (the API's and the Studio's)."""
    settings = runner.settings
    budget = book.ArchiveBudget(settings.epub_max_bytes, settings.epub_max_entries)
    items = await asyncio.to_thread(job_items, body, budget, settings.jobs_max_chars,
                                    settings.batch_max_job_items)
    chars = sum(len(i.text) for i in items)
    details = book.BookDetails()
    if body.input_format == "epub" and body.input is not None:
        details = await asyncio.to_thread(book.epub_details, body.input, budget,
                                          body.response_format == BOOK_FORMAT)
    files = ({COVER_NAME: details.cover}
             if details.cover and body.response_format == BOOK_FORMAT else {})
    return await runner.create(owner, "book", {
        "model": body.model, "voice": body.voice_id, "speed": body.speed,
        "response_format": body.response_format, "title": body.title or details.title,
        "author": details.author, "input_format": body.input_format, "chars": chars,
        **(extra or {})}, items, client, files=files)
