"""Long-form routes: `POST /v1/audio/batch` and `/v1/audio/jobs` (see `app.jobs`; who owns a
job: `app.jobs.front`). Every job store read and write runs in a thread, and so do reading a job
request (`parse_job_request`) and building and serializing a job's card (`card_json`, answered
as bytes: FastAPI would serialize a `response_model` on the loop): the event loop only routes
and frames."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse

from app.audio.encoders import CONTENT_TYPES, PCM_RATE, content_type, output_rate
from app.http.deps import ClientDep, RequestIdDep, ServiceDep
from app.http.disconnect import unless_disconnected
from app.jobs.batch import batch_items, run_batch
from app.jobs.front import (
    card_json,
    card_payload,
    job_card,
    list_json,
    owner_of,
    parse_job_request,
    parse_request,
    start_job,
)
from app.jobs.model import BOOK_FORMAT, Item, Job, JobNotFound, JobNotReady
from app.jobs.outputs import Outputs
from app.jobs.results import (
    encoded,
    item_captions,
    item_chunks,
    item_ready,
    whole_chunks,
    whole_rate,
    write_zip,
)
from app.jobs.runner import JobRunner
from app.jobs.store import Store
from app.protocols.schemas import (
    ERROR_RESPONSES,
    BatchRequest,
    JobCard,
    JobList,
    JobRequest,
)
from engines.base import InvalidParameter

JSON = "application/json"
PIECE_BYTES = 256 * 1024
"""A JSON answer longer than this is sent a piece at a time: one `send` of a 12 MB body held
the event loop 0.1-0.25 s here (in 256 KB pieces: 5 ms at most)."""

router = APIRouter(tags=["jobs"])

_AUDIO: dict[int | str, dict[str, Any]] = {200: {"content": {
    content_type(fmt, PCM_RATE): {} for fmt in CONTENT_TYPES if fmt != "ulaw"}}}
"""The job's format, pcm at OpenAI's rate (the schema names what each route may answer)."""
_ZIP: dict[int | str, dict[str, Any]] = {200: {"content": {"application/zip": {}}}}
_CAPTIONS: dict[int | str, dict[str, Any]] = {200: {"content": {
    "application/x-subrip; charset=utf-8": {}, "text/vtt; charset=utf-8": {}}}}

def _runner(request: Request) -> JobRunner:
    runner: JobRunner = request.app.state.jobs
    return runner.available()


OwnerDep = Annotated[str, Depends(owner_of)]
RunnerDep = Annotated[JobRunner, Depends(_runner)]


def _inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its `$defs` written in place: a schema given in
    `openapi_extra` sits inside the OpenAPI document, where `#/$defs/...` points nowhere."""
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, list):
            return [resolve(value) for value in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            rest = {key: value for key, value in node.items() if key != "$ref"}
            return resolve(copy.deepcopy(defs[ref.removeprefix("#/$defs/")])) | resolve(rest)
        return {key: resolve(value) for key, value in node.items() if key != "$defs"}

    resolved: dict[str, Any] = resolve(schema)
    return resolved


_JOB_REQUEST = {"requestBody": {"required": True, "content": {
    JSON: {"schema": _inline(JobRequest.model_json_schema())}}}}
_BATCH_REQUEST = {"requestBody": {"required": True, "content": {
    JSON: {"schema": _inline(BatchRequest.model_json_schema())}}}}


def _outputs(request: Request) -> Outputs | None:
    outputs: Outputs | None = request.app.state.outputs
    return outputs


async def _job(runner: JobRunner, job_id: str, owner: str) -> Job:
    job = await asyncio.to_thread(runner.store.job, job_id)
    if job is None or job.owner != owner:
        raise JobNotFound(f"No job '{job_id}'", param="id")
    return job


# -- batch -------------------------------------------------------------------------------------

@router.post("/v1/audio/batch", responses={**ERROR_RESPONSES, 202: {"model": JobCard}},
             response_class=Response, openapi_extra=_BATCH_REQUEST)
async def create_batch(request: Request, service: ServiceDep, owner: OwnerDep,
                       request_id: RequestIdDep, client: ClientDep) -> Response:
    """Speech bodies, at most `VOXMUX_BATCH_MAX_JOB_ITEMS` (counted before the body is parsed
    whole, in a worker thread): a ZIP of their audio, or above `VOXMUX_BATCH_MAX_ITEMS` a job."""
    settings = service.settings
    body = await asyncio.to_thread(parse_request, BatchRequest, await _body(request),
                                   settings.batch_max_job_items, settings.jobs_max_chars)
    if len(body.items) > settings.batch_max_items:
        runner = _runner(request)  # only a batch that becomes a job needs the store
        items = batch_items(body.items)
        job = await runner.create(owner, "batch", {"items": len(items)}, items, client)
        return JSONResponse((await job_card(runner, job)).model_dump(), status_code=202,
                            headers={"Location": f"/v1/audio/jobs/{job.id}"})
    members, entries = await unless_disconnected(
        request, run_batch(service, body.items, request_id, client))
    buffer = io.BytesIO()
    manifest = {"items": entries}
    await asyncio.to_thread(write_zip, buffer, members, manifest)
    data = buffer.getvalue()
    if (outputs := _outputs(request)) is not None:
        await asyncio.to_thread(outputs.write, f"batch-{request_id}", "zip", data,
                                {"route": "/v1/audio/batch", "request_id": request_id,
                                 **manifest})
    return _sent(data, "application/zip",
                 headers={"Content-Disposition": 'attachment; filename="batch.zip"'})


# -- jobs --------------------------------------------------------------------------------------

def _json(body: bytes, status_code: int = 200, headers: dict[str, str] | None = None
          ) -> Response:
    """`body` (JSON made in a worker thread) as the answer (`_sent`)."""
    return _sent(body, JSON, status_code, headers)


def _sent(body: bytes, media_type: str, status_code: int = 200,
          headers: dict[str, str] | None = None) -> Response:
    """`body` as the answer: whole when short, else in pieces of `PIECE_BYTES`, its length
    declared (one send of many megabytes holds the loop about 10 ms a megabyte)."""
    if len(body) <= PIECE_BYTES:
        return Response(body, status_code=status_code, media_type=media_type, headers=headers)

    async def pieces() -> AsyncIterator[bytes]:
        view = memoryview(body)
        for at in range(0, len(body), PIECE_BYTES):
            yield bytes(view[at:at + PIECE_BYTES])

    return StreamingResponse(pieces(), status_code=status_code, media_type=media_type,
                             headers={**(headers or {}), "Content-Length": str(len(body))})


async def _body(request: Request) -> bytearray:
    """The request's body as it arrives, into one buffer the size its `Content-Length` says
    (never a list of its chunks joined, nor a buffer grown by copies: up to
    `jobs_max_request_bytes`, which the edge checks first)."""
    try:
        size = max(0, int(request.headers.get("content-length", "0")))
    except ValueError:
        size = 0
    raw, at = bytearray(size), 0
    async for chunk in request.stream():
        if at + len(chunk) <= size:
            raw[at:at + len(chunk)] = chunk
        else:
            del raw[at:]
            raw += chunk
        at += len(chunk)
    del raw[at:]
    return raw


@router.post("/v1/audio/jobs", status_code=202, responses=ERROR_RESPONSES,
             response_model=JobCard, openapi_extra=_JOB_REQUEST)
async def create_job(request: Request, runner: RunnerDep, owner: OwnerDep,
                     client: ClientDep) -> Response:
    """A book (`input`: text, SSML, Markdown or an EPUB in base64) or a list of `items`, at
    most `VOXMUX_BATCH_MAX_JOB_ITEMS` of them, as a job: 202 and its card."""
    settings = runner.settings
    body = await asyncio.to_thread(parse_job_request, await _body(request),
                                   settings.batch_max_job_items, settings.jobs_max_chars)
    job = await start_job(runner, owner, body, client)
    return _json(await card_json(runner, job), 202, {"Location": f"/v1/audio/jobs/{job.id}"})


@router.get("/v1/audio/jobs", response_model=JobList, responses=ERROR_RESPONSES)
async def list_jobs(runner: RunnerDep, owner: OwnerDep,
                    limit: int = Query(100, ge=1, le=1000,
                                       description="Most jobs answered, newest first"),
                    after: str | None = Query(None, description="The last job id of the page "
                                              "before (its `last_id`): the next page")
                    ) -> Response:
    """The caller's jobs, newest first, a page at a time (`has_more`, `last_id`)."""
    return _json(await list_json(runner, owner, limit, after))


@router.get("/v1/audio/jobs/{job_id}", response_model=JobCard, responses=ERROR_RESPONSES)
async def get_job(job_id: str, runner: RunnerDep, owner: OwnerDep) -> Response:
    job = await _job(runner, job_id, owner)
    return _json(await card_json(runner, job, chapters=True))


@router.delete("/v1/audio/jobs/{job_id}", response_model=JobCard, responses=ERROR_RESPONSES)
async def delete_job(job_id: str, runner: RunnerDep, owner: OwnerDep,
                     purge: bool = Query(False, description="Also delete its stored audio")
                     ) -> Response:
    """Cancel a queued or running job (its finished chapters stay readable); `purge=true`
    deletes the job and its files whatever its state."""
    job = await _job(runner, job_id, owner)
    if purge:
        body = await card_json(runner, job)
        await runner.delete(job)
        return _json(body)
    await runner.cancel(job)
    for _ in range(100):  # a running one stops at its engine's next step
        job = await _job(runner, job_id, owner)
        if job.ended:
            break
        await asyncio.sleep(0.05)
    return _json(await card_json(runner, job))


@router.get("/v1/audio/jobs/{job_id}/events", responses=ERROR_RESPONSES,
            response_class=StreamingResponse)
async def job_events(job_id: str, runner: RunnerDep, owner: OwnerDep) -> StreamingResponse:
    """Server-sent events: `job.progress` at every finished segment and state change, then one
    of `job.done`, `job.failed`, `job.cancelled`; a comment every 15 s keeps proxies open."""
    await _job(runner, job_id, owner)
    store = runner.store

    async def events() -> AsyncIterator[bytes]:
        last = None
        while True:
            job = await asyncio.to_thread(store.job, job_id)
            if job is None:
                return
            payload = await card_payload(runner, job)
            key = (job.status, payload["progress"]["done"])
            if key != last:
                kind = f"job.{job.status}" if job.ended else "job.progress"
                yield f"data: {json.dumps({'type': kind, **payload})}\n\n".encode()
                last = key
            if job.ended:
                return
            await runner.changed(job_id, 15)
            if key == last:  # (the next turn ends the stream if the job is gone)
                yield b": keep-alive\n\n"

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _streamed(chunks: Iterator[Any], fmt: str, rate: int) -> AsyncIterator[bytes]:
    async def body() -> AsyncIterator[bytes]:
        produced = encoded(chunks, fmt, rate)
        while (data := await asyncio.to_thread(next, produced, None)) is not None:
            if data:
                yield data
    return body()


def _audio_headers(fmt: str, rate: int, name: str) -> dict[str, str]:
    out = PCM_RATE if fmt == "pcm" else output_rate(fmt, rate)
    return {"X-Sample-Rate": str(out),
            "Content-Disposition": f'attachment; filename="{name}.{fmt}"'}


def _media(fmt: str, rate: int) -> str:
    return f"{CONTENT_TYPES[fmt]};rate={PCM_RATE}" if fmt == "pcm" else CONTENT_TYPES[fmt]


@router.get("/v1/audio/jobs/{job_id}/audio", response_class=Response, responses=ERROR_RESPONSES | {
    200: {"content": _AUDIO[200]["content"] | _ZIP[200]["content"]}})
async def job_audio(job_id: str, runner: RunnerDep, owner: OwnerDep) -> Response:
    """The whole result: every chapter in order in the asked format (a batch job: its ZIP)."""
    job = await _job(runner, job_id, owner)
    if job.status != "done":
        raise JobNotReady(f"The job is {job.status}; its audio is whole once it is done",
                          param="id")
    if job.kind == "batch":
        return await job_result_zip(job_id, runner, owner)
    fmt = str(job.request.get("response_format", "mp3"))
    if fmt == BOOK_FORMAT:
        path = await runner.result_book(job)
        return FileResponse(path, media_type="audio/mp4", filename=f"{job.id}.m4b")
    items = await asyncio.to_thread(runner.store.items, job.id)
    rate = whole_rate(items)
    chunks = whole_chunks(runner.store, job.id, items, runner.settings.chapter_pause_ms)
    return StreamingResponse(_streamed(chunks, fmt, rate), media_type=_media(fmt, rate),
                             headers=_audio_headers(fmt, rate, job.id))


def _item(store: Store, job: Job, number: int) -> Item:
    """Chapter `number` (1-based), once it is finished, read alone; blocking."""
    item = store.item(job.id, number - 1) if 1 <= number <= 1 << 31 else None
    if item is None:
        raise JobNotFound(f"The job has no chapter {number} (1 to {store.item_count(job.id)})",
                          param="chapter")
    if item.error is not None:
        raise JobNotReady(f"Chapter {number} failed: {item.error.get('message')}",
                          param="chapter")
    if not item_ready(store, job.id, item):
        raise JobNotReady(f"Chapter {number} is not finished yet", param="chapter")
    return item


@router.get("/v1/audio/jobs/{job_id}/chapters/{number}/audio", response_class=Response,
            responses=ERROR_RESPONSES | _AUDIO)
async def chapter_audio(job_id: str, number: int, runner: RunnerDep, owner: OwnerDep
                        ) -> Response:
    """One chapter (1-based) in the asked format, as soon as that chapter is finished."""
    job = await _job(runner, job_id, owner)
    item = await asyncio.to_thread(_item, runner.store, job, number)
    fmt, rate = item.options.response_format, item.sample_rate or 24_000
    chunks = item_chunks(runner.store, job.id, item)
    return StreamingResponse(_streamed(chunks, fmt, rate), media_type=_media(fmt, rate),
                             headers=_audio_headers(fmt, rate, f"{job.id}-{number:03d}"))


@router.get("/v1/audio/jobs/{job_id}/chapters/{number}/captions", response_class=Response,
            responses=ERROR_RESPONSES | _CAPTIONS)
async def chapter_captions(job_id: str, number: int, runner: RunnerDep, owner: OwnerDep,
                           format: str = Query("srt", pattern="^(srt|vtt)$")) -> Response:
    """SRT or WebVTT for one chapter, from the word timings its engine reported."""
    job = await _job(runner, job_id, owner)
    item = await asyncio.to_thread(_item, runner.store, job, number)
    text = await asyncio.to_thread(item_captions, runner.store, job.id, item,
                                   format)  # type: ignore[arg-type]
    if text is None:
        raise InvalidParameter(f"The {item.options.model} engine reports no word timings",
                               param="format", code="timestamps_unsupported")
    media = "application/x-subrip" if format == "srt" else "text/vtt"
    return Response(text, media_type=f"{media}; charset=utf-8")


@router.get("/v1/audio/jobs/{job_id}/zip", response_class=Response,
            responses=ERROR_RESPONSES | _ZIP)
async def job_result_zip(job_id: str, runner: RunnerDep, owner: OwnerDep) -> Response:
    """Every chapter's audio and captions with a `manifest.json`, once the job is done."""
    job = await _job(runner, job_id, owner)
    if job.status != "done":
        raise JobNotReady(f"The job is {job.status}; its ZIP is made once it is done",
                          param="id")
    path = await runner.result_zip(job)
    return FileResponse(path, media_type="application/zip", filename=f"{job.id}.zip")
