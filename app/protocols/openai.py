"""Speech jobs over HTTP: chunked audio or OpenAI-style SSE, from a response that owns the job.

`JobResponse` is the ASGI response of a streamed speech route. It enters the job itself (`async
with`), so cleanup runs however the exchange ends, even when the client left before the first
byte. It awaits the first audio before sending headers, so a failure there (queue full, a model
that fails to load, a voice the engine rejects) is still a proper error status. A client that
hangs up cancels the job. A failure after the headers aborts a raw audio transfer (logged; the
body is left unterminated, so no client takes the truncated audio for a whole file) or becomes
an SSE `error` event.

OpenAI defines `pcm` as 24 kHz s16le mono, and its clients (the SDKs, voice-agent frameworks)
play it at 24 kHz without reading any header: on this route pcm is resampled to `PCM_RATE` from
whatever rate the engine runs at. The native routes keep the engine's rate and state it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import AsyncIterator, Callable

import numpy as np
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from app.audio.encoders import PCM_RATE, StreamEncoder, content_type
from app.http.errors import as_voxmux, error_body, error_response
from app.protocols.timestamps import word_json
from app.serving import tracing
from app.serving.events import JobEvent, SegmentWords
from app.serving.job import SpeechJob
from engines.base import Audio, InvalidParameter

log = logging.getLogger(__name__)

Body = Callable[[SpeechJob, AsyncIterator[JobEvent], StreamEncoder], AsyncIterator[bytes]]
"""Produces the body from the job's events (audio chunks, and the segment ends and words that
come with them) and the encoder; raises `_Aborted` on a failure that must leave the transfer
unterminated."""


class _Aborted(Exception):
    """The audio failed after the headers were sent; the transfer must not look complete."""


WARNINGS_HEADER_CHARS = 2000
"""Past this the warnings header is cut (proxies refuse headers of 8 KB and more)."""


def warnings_header(warnings: list[str]) -> str:
    """Each warning once, in order, as one header value: Latin-1 (other characters as \\u
    escapes), control characters (a client's text can carry them into a warning) as spaces, at
    most `WARNINGS_HEADER_CHARS` characters."""
    text = "; ".join(dict.fromkeys(warnings))
    text = re.sub(r"[\x00-\x1f\x7f]", " ", text).encode("latin-1", "backslashreplace").decode(
        "latin-1")
    if len(text) > WARNINGS_HEADER_CHARS:
        text = text[:WARNINGS_HEADER_CHARS - 3] + "..."
    return text


def job_headers(job: SpeechJob, sample_rate: int) -> dict[str, str]:
    plan = job.plan
    headers = {
        "X-Sample-Rate": str(sample_rate),
        "X-VoxMux-Model": plan.model_id,
        "X-VoxMux-Voice": plan.voice,
        "X-VoxMux-Segments": str(job.segments),
        "X-VoxMux-Cache": job.cache_use,
    }
    if plan.warnings:
        headers["X-VoxMux-Warnings"] = warnings_header(plan.warnings)
    if plan.report:
        report = plan.prepared.report if plan.prepared is not None else []
        headers["X-VoxMux-Normalization"] = json.dumps(report, separators=(",", ":"))
    return headers


async def first_audio(job: SpeechJob, events: AsyncIterator[JobEvent]) -> list[JobEvent]:
    """The job's events up to its first audio chunk; a job that ends without audio had nothing
    to say."""
    head: list[JobEvent] = []
    try:
        while not isinstance(event := await anext(events), np.ndarray):
            head.append(event)
    except StopAsyncIteration:
        raise InvalidParameter(
            "The input has nothing speakable in it", param="input", code="empty_audio"
        ) from None
    return [*head, event]


async def encode(encoder: StreamEncoder, chunk: Audio | None) -> bytes:
    """Codec and resampler work (LAME, Opus, AAC, FLAC, soxr) runs in a worker thread, off the
    event loop; raw formats at the input's rate are a copy and stay inline. `None` finishes the
    stream."""
    if encoder.format in ("pcm", "wav") and not encoder.resampling:  # (a copy: no span)
        return encoder.finish() if chunk is None else encoder.encode(chunk)
    with tracing.span("encode", {"voxmux.format": encoder.format}):
        if chunk is None:
            return await asyncio.to_thread(encoder.finish)
        return await asyncio.to_thread(encoder.encode, chunk)


async def _watch_disconnect(receive: Receive, job: SpeechJob) -> None:
    """Cancel the job when the client hangs up (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    job.cancel()


class JobResponse(Response):
    """A `Response` only so FastAPI passes it through; it sends everything itself."""

    def __init__(self, job: SpeechJob, fmt: str, body: Body, media_type: str | None = None,
                 headers: dict[str, str] | None = None, rate: int | None = None, *,
                 bit_rate: int | None = None,
                 errors: Callable[[BaseException], Response] = error_response) -> None:
        """`media_type` None: the audio format's own; `rate`: resample the audio to it;
        `bit_rate`: a lossy codec's own; `errors`: the response for a failure before the first
        audio (another protocol's error shape)."""
        self.status_code = 200
        self.background = None
        self.job = job
        self._errors = errors
        self._encoder = StreamEncoder(fmt, job.sample_rate, rate, bit_rate)
        self._content_type = media_type or content_type(fmt, self._encoder.output_sample_rate)
        self._frame = body
        self._extra_headers = headers or {}
        self.keep: Callable[[bytes], None] | None = None
        """Given the whole body, off the event loop, once it has been sent complete (the
        outputs directory)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracing.current().set_attribute("voxmux.format", self._encoder.format)
        async with self.job:
            watcher = asyncio.create_task(_watch_disconnect(receive, self.job))
            try:
                await self._respond(scope, receive, send)
            finally:
                watcher.cancel()
        if self.background is not None:
            await self.background()

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        events = self.job.events()
        try:
            head = await first_audio(self.job, events)
        except Exception as exc:
            await self._errors(exc)(scope, receive, send)
            return
        named = job_headers(self.job, self._encoder.output_sample_rate) | self._extra_headers
        headers = [(b"content-type", self._content_type.encode())]
        headers += [(k.lower().encode(), v.encode()) for k, v in named.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        kept: list[bytes] | None = [] if self.keep is not None else None
        try:
            async for data in self._frame(self.job, _prepend(head, events), self._encoder):
                await send({"type": "http.response.body", "body": data, "more_body": True})
                if kept is not None:
                    kept.append(data)
        except _Aborted:
            return  # the server closes the connection without the final chunk
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if self.keep is not None and kept is not None:
            await asyncio.to_thread(self.keep, b"".join(kept))


async def _prepend(head: list[JobEvent], rest: AsyncIterator[JobEvent]
                   ) -> AsyncIterator[JobEvent]:
    for event in head:
        yield event
    async for event in rest:
        yield event


async def audio_bytes(job: SpeechJob, events: AsyncIterator[JobEvent], encoder: StreamEncoder
                       ) -> AsyncIterator[bytes]:
    try:
        async for chunk in events:
            if isinstance(chunk, np.ndarray) and (data := await encode(encoder, chunk)):
                yield data
        yield await encode(encoder, None)
    except Exception as exc:
        log.warning("request %s aborted after streaming began: %s", job.plan.request_id,
                    as_voxmux(exc).message)
        raise _Aborted from exc


def _event(payload: dict[str, object]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _sse_events(job: SpeechJob, events: AsyncIterator[JobEvent], encoder: StreamEncoder
                      ) -> AsyncIterator[bytes]:
    def delta(data: bytes) -> bytes:
        return _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    try:
        async for chunk in events:
            if isinstance(chunk, SegmentWords):  # only a plan with timestamps has them
                yield _event({"type": "speech.audio.timestamps",
                              "words": [word_json(w) for w in chunk.words]})
            elif isinstance(chunk, np.ndarray) and (data := await encode(encoder, chunk)):
                yield delta(data)
        if tail := await encode(encoder, None):
            yield delta(tail)
    except Exception as exc:  # the stream is already 200: report, never a broken socket
        yield _event({"type": "error", **error_body(exc)})
        return
    chars = len(job.plan.text) if isinstance(job.plan.text, str) else 0
    assert job.stats is not None  # the events ended: the job has finished
    yield _event({
        "type": "speech.audio.done",
        "usage": {"input_tokens": chars, "output_tokens": 0, "total_tokens": chars},
        "stats": job.stats.envelope(),
    })


def audio_response(job: SpeechJob, fmt: str, rate: int | None = None) -> JobResponse:
    return JobResponse(job, fmt, audio_bytes, rate=rate)


def sse_response(job: SpeechJob, fmt: str, rate: int | None = None) -> JobResponse:
    return JobResponse(job, fmt, _sse_events, "text/event-stream", {"Cache-Control": "no-cache"},
                       rate)


def speech_response(job: SpeechJob, fmt: str, stream_format: str) -> JobResponse:
    """OpenAI's speech route: audio or SSE, with `pcm` at OpenAI's 24 kHz."""
    rate = PCM_RATE if fmt == "pcm" else None
    if stream_format == "sse":
        return sse_response(job, fmt, rate)
    return audio_response(job, fmt, rate)
