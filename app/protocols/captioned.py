"""Captioned speech: audio as base64 in JSON with its word timings, Kokoro-FastAPI's shape
(`audio`, `audio_format`, `timestamps` of `{word, start_time, end_time}`) plus ElevenLabs-style
character `alignment` and, on request, SRT or WebVTT `captions`.

Whole: one JSON object once the clip is complete. Streamed: newline-delimited JSON, one object
per segment as it is synthesized (its encoded audio, its words, its characters), then a last
object with the encoder's tail and the captions; a failure after the first line is an `error`
line, as in SSE.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from app.audio.encoders import CONTENT_TYPES, StreamEncoder, output_rate
from app.http.errors import error_body
from app.protocols.native import compact, whole_encoded
from app.protocols.openai import JobResponse, encode, job_headers
from app.protocols.timestamps import CaptionFormat, alignment, captions, kokoro_word
from app.serving.events import JobEvent, SegmentEnd, SegmentWords
from app.serving.job import SpeechJob
from engines.base import WordTiming

MEDIA_TYPE = "application/x-ndjson"


def _text(job: SpeechJob) -> str:
    """The client's text (markup blanked): word spans point into it."""
    return job.plan.caption_text


def _timed(job: SpeechJob, body: dict[str, Any], words: list[WordTiming], start: int = 0,
           end: int | None = None) -> dict[str, Any]:
    if job.plan.timestamps:
        body["timestamps"] = [kokoro_word(w) for w in words]
        body["alignment"] = alignment(_text(job), words, start, end)
    else:
        body["timestamps"] = None
        body["alignment"] = None
    return body


async def whole_response(job: SpeechJob, fmt: str, caption: CaptionFormat | None,
                         request: Request) -> Response:
    data, words = await whole_encoded(job, StreamEncoder(fmt, job.sample_rate), request)
    rest = _timed(job, {"audio_format": CONTENT_TYPES[fmt]}, words)
    if caption is not None:
        rest["captions"] = captions(_text(job), words, caption)
    headers = job_headers(job, output_rate(fmt, job.sample_rate))
    assert job.stats is not None
    headers["X-VoxMux-Stats"] = compact(job.stats.envelope())
    return StreamingResponse(audio_json("audio", data, rest), media_type="application/json",
                             headers=headers)


BASE64_SLICE = 3 * 256 * 1024
"""Bytes of audio put in base64 at a time (a multiple of 3: the pieces join into one string)."""


async def audio_json(key: str, audio: list[bytes], rest: dict[str, Any]
                     ) -> AsyncIterator[bytes]:
    """A JSON object whose first member `key` is the `audio` pieces as one base64 string, then
    the members of `rest`, written piece by piece: minutes of audio as one base64 string, then
    one JSON document, took hundreds of megabytes and held the GIL (the event loop with it) for
    a tenth of a second."""
    yield b"{" + json.dumps(key).encode() + b':"'
    carry = b""
    for piece in audio:
        for start in range(0, len(piece), BASE64_SLICE):
            data = carry + piece[start:start + BASE64_SLICE]
            whole = len(data) - len(data) % 3  # base64 pieces join only on 3-byte bounds
            carry = data[whole:]
            yield base64.b64encode(data[:whole])
            await asyncio.sleep(0)
    yield base64.b64encode(carry)
    tail = json.dumps(rest, ensure_ascii=False, separators=(",", ":"))
    yield b'"' + (b"," + tail[1:].encode() if len(tail) > 2 else b"}")


def ndjson_line(body: dict[str, Any]) -> bytes:
    """One line of newline-delimited JSON (captioned and ElevenLabs' streamed timestamps)."""
    return (json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class EncodedSegment:
    """One segment's audio as the encoder gave it, its words, and its span in the text sent;
    the last one (`span` None) is the encoder's tail."""

    audio: bytes
    words: list[WordTiming]
    span: tuple[int, int] | None


async def encoded_segments(job: SpeechJob, events: AsyncIterator[JobEvent],
                           encoder: StreamEncoder) -> AsyncIterator[EncodedSegment]:
    """A job's events grouped segment by segment (captioned and ElevenLabs' streamed lines)."""
    pending, words = b"", []
    offsets = job.plan.offsets
    async for event in events:
        if isinstance(event, np.ndarray):
            pending += await encode(encoder, event)
        elif isinstance(event, SegmentWords):
            words = list(event.words)
        elif isinstance(event, SegmentEnd):
            start = offsets[event.index] if event.index < len(offsets) else 0
            yield EncodedSegment(pending, words,
                                 job.plan.source_span(start, start + len(event.text)))
            pending, words = b"", []
    yield EncodedSegment(pending + await encode(encoder, None), [], None)


def stream_response(job: SpeechJob, fmt: str, caption: CaptionFormat | None) -> JobResponse:
    async def lines(job: SpeechJob, events: AsyncIterator[JobEvent], encoder: StreamEncoder
                    ) -> AsyncIterator[bytes]:
        content_type = CONTENT_TYPES[fmt]
        every: list[WordTiming] = []
        tail = b""
        try:
            async for piece in encoded_segments(job, events, encoder):
                if piece.span is None:
                    tail = piece.audio
                    break
                every += piece.words
                yield ndjson_line(_timed(job, {"audio": base64.b64encode(piece.audio).decode(),
                                               "audio_format": content_type},
                                         piece.words, *piece.span))
        except Exception as exc:  # the stream is already 200: report, never a broken socket
            yield ndjson_line(error_body(exc))
            return
        last: dict[str, Any] = {"audio": base64.b64encode(tail).decode(),
                                "audio_format": content_type}
        if job.plan.timestamps:
            last |= {"timestamps": [], "alignment": alignment("", [], 0, 0)}
        if caption is not None:
            last["captions"] = captions(_text(job), every, caption)
        yield ndjson_line(last)

    return JobResponse(job, fmt, lines, MEDIA_TYPE, {"Cache-Control": "no-cache"})
