"""Whole clips: the one-shot routes (`POST /v1/synth`, `GET /api/tts`) and the Studio's player.

A one-shot clip is synthesized whole before the response starts, so every failure keeps its
status and the stats headers can hold end-of-request figures. A client that hangs up meanwhile
cancels it.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
from fastapi import Request
from fastapi.responses import Response

from app.audio.encoders import StreamEncoder, content_type, encode_whole, output_rate
from app.protocols.openai import encode, job_headers
from app.serving import tracing
from app.serving.events import SegmentWords
from app.serving.job import SpeechJob
from engines.base import Audio, InvalidParameter, WordTiming


async def _cancel_on_disconnect(request: Request, job: SpeechJob) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def whole_clip(job: SpeechJob, request: Request | None = None) -> Audio:
    """Run `job` to its end and return its audio; with `request`, a hang-up cancels it."""
    return (await whole_timed(job, request))[0]


async def whole_timed(job: SpeechJob, request: Request | None = None
                      ) -> tuple[Audio, list[WordTiming]]:
    """`whole_clip`, with the words of a plan that asks for timestamps."""
    chunks: list[Audio] = []
    words: list[WordTiming] = []
    async with job:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job)) if request else None
        try:
            async for event in job.events():
                if isinstance(event, np.ndarray):
                    chunks.append(event)
                elif isinstance(event, SegmentWords):
                    words += event.words
        finally:
            if watcher is not None:
                watcher.cancel()
    if not chunks:
        raise InvalidParameter("The input has nothing speakable in it", param="input",
                               code="empty_audio")
    return np.concatenate(chunks), words


async def whole_encoded(job: SpeechJob, encoder: StreamEncoder, request: Request | None = None
                        ) -> tuple[list[bytes], list[WordTiming]]:
    """`whole_timed`'s clip as `encoder` encodes it, a chunk at a time as the job makes them
    (in worker threads), in pieces: what is held is the encoded clip once, not its float
    samples twice over."""
    pieces: list[bytes] = []
    words: list[WordTiming] = []
    async with job:
        watcher = asyncio.create_task(_cancel_on_disconnect(request, job)) if request else None
        try:
            async for event in job.events():
                if isinstance(event, np.ndarray):
                    pieces.append(await encode(encoder, event))
                elif isinstance(event, SegmentWords):
                    words += event.words
        finally:
            if watcher is not None:
                watcher.cancel()
    if not any(pieces):
        raise InvalidParameter("The input has nothing speakable in it", param="input",
                               code="empty_audio")
    pieces.append(await encode(encoder, None))
    return pieces, words


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


async def clip_response(job: SpeechJob, audio: Audio, fmt: str) -> Response:
    """The encoded clip with the job's headers and its stats in `X-VoxMux-Stats`."""
    # A whole clip through LAME or Opus takes long enough to stall every other stream.
    tracing.current().set_attribute("voxmux.format", fmt)
    with tracing.span("encode", {"voxmux.format": fmt}):
        body = await asyncio.to_thread(encode_whole, audio, job.sample_rate, fmt)
    rate = output_rate(fmt, job.sample_rate)
    headers = job_headers(job, rate)
    assert job.stats is not None
    headers["X-VoxMux-Stats"] = compact(job.stats.envelope())
    return Response(body, media_type=content_type(fmt, rate), headers=headers)
