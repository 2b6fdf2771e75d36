"""Turn a running `AudioStream` into an HTTP response: chunked audio or OpenAI-style SSE.

The first chunk is awaited before the response starts, so a load or synthesis failure on it is
still a proper error status; later failures abort a raw audio transfer (logged; the body is left
unterminated, so no client takes the truncated audio for a whole file) or become an SSE `error`
event.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Send

from app.audio.encoders import CONTENT_TYPES, StreamEncoder
from app.http.errors import error_body
from app.serving.service import AudioStream, SpeechJob
from engines.base import Audio, InvalidParameter, SynthesisFailed, VoxMuxError

log = logging.getLogger(__name__)


async def cancel_on_disconnect(request: Request, stream: AudioStream) -> None:
    """Cancel `stream` when the HTTP client hangs up (the request body is already read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    stream.cancel()


async def first_chunk(stream: AudioStream, request: Request | None = None) -> Audio:
    """Wait for the first audio; on failure the stream is closed and the error raised.

    With `request`, a client that hangs up meanwhile (while queued, say) cancels the job at once
    rather than when its turn comes.
    """
    watcher = asyncio.create_task(cancel_on_disconnect(request, stream)) if request else None
    try:
        return await anext(stream)
    except StopAsyncIteration:
        await stream.aclose()
        raise InvalidParameter(
            "The input has nothing speakable in it", param="input", code="empty_audio"
        ) from None
    except BaseException:
        await stream.aclose()
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)


def job_headers(job: SpeechJob, encoder: StreamEncoder) -> dict[str, str]:
    return base_headers(job, encoder.output_sample_rate)


def base_headers(job: SpeechJob, sample_rate: int) -> dict[str, str]:
    headers = {
        "X-Sample-Rate": str(sample_rate),
        "X-VoxMux-Model": job.model.id,
        "X-VoxMux-Voice": job.voice,
        "X-VoxMux-Segments": str(len(job.segments)),
        "X-VoxMux-Cache": job.stats.cache,
    }
    if job.warnings:
        headers["X-VoxMux-Warnings"] = "; ".join(job.warnings)
    return headers


async def _chunks(first: Audio, stream: AudioStream) -> AsyncIterator[Audio]:
    yield first
    async for chunk in stream:
        yield chunk


class _Aborted(Exception):
    """The audio failed after the headers were sent; the transfer must not look complete."""


class AbortableStreamingResponse(StreamingResponse):
    """Leaves the body unterminated when its iterator raises `_Aborted`: the server then closes
    the connection without the final chunk, and the client sees an incomplete transfer."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except _Aborted:
            return


async def _encode(encoder: StreamEncoder, chunk: Audio | None) -> bytes:
    """Codec work (LAME, Opus, AAC, FLAC) runs in a worker thread, off the event loop; raw
    formats are a copy and stay inline. `None` finishes the stream."""
    if encoder.format in ("pcm", "wav"):
        return encoder.finish() if chunk is None else encoder.encode(chunk)
    if chunk is None:
        return await asyncio.to_thread(encoder.finish)
    return await asyncio.to_thread(encoder.encode, chunk)


async def _audio_bytes(first: Audio, stream: AudioStream, encoder: StreamEncoder
                       ) -> AsyncIterator[bytes]:
    try:
        async for chunk in _chunks(first, stream):
            data = await _encode(encoder, chunk)
            if data:
                yield data
        yield await _encode(encoder, None)
    except VoxMuxError as exc:
        log.warning("request %s aborted after streaming began: %s", stream.job.id, exc.message)
        raise _Aborted from exc
    finally:
        await stream.aclose()


def audio_response(job: SpeechJob, stream: AudioStream, first: Audio, fmt: str
                   ) -> StreamingResponse:
    encoder = StreamEncoder(fmt, job.sample_rate)
    return AbortableStreamingResponse(
        _audio_bytes(first, stream, encoder),
        media_type=CONTENT_TYPES[fmt],
        headers=job_headers(job, encoder),
    )


def _event(payload: dict[str, object]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def _sse_events(job: SpeechJob, first: Audio, stream: AudioStream,
                      encoder: StreamEncoder) -> AsyncIterator[str]:
    def delta(data: bytes) -> str:
        return _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})

    try:
        async for chunk in _chunks(first, stream):
            data = await _encode(encoder, chunk)
            if data:
                yield delta(data)
        tail = await _encode(encoder, None)
        if tail:
            yield delta(tail)
        chars = len(job.text)
        yield _event({
            "type": "speech.audio.done",
            "usage": {"input_tokens": chars, "output_tokens": 0, "total_tokens": chars},
            "stats": job.stats.envelope(job.sample_rate, len(job.segments)),
        })
    except VoxMuxError as exc:
        yield _event({"type": "error", **error_body(exc)})
    except Exception as exc:  # the stream is already 200: report, never a broken socket
        log.exception("SSE stream %s failed", job.id)
        yield _event({"type": "error", **error_body(SynthesisFailed(str(exc)))})
    finally:
        await stream.aclose()


def sse_response(job: SpeechJob, stream: AudioStream, first: Audio, fmt: str
                 ) -> StreamingResponse:
    encoder = StreamEncoder(fmt, job.sample_rate)
    headers = job_headers(job, encoder) | {"Cache-Control": "no-cache"}
    return StreamingResponse(
        _sse_events(job, first, stream, encoder), media_type="text/event-stream", headers=headers
    )
