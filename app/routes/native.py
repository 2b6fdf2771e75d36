"""One-shot routes: `POST /v1/synth` (WAV + `X-VoxMux-Stats`) and legacy `GET /api/tts`.

The whole clip is synthesized before the response starts, so every failure keeps its status and
the stats header can hold end-of-request figures. A client that hangs up meanwhile cancels it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.audio import CONTENT_TYPES, FORMATS, encode_whole, output_rate
from app.deps import RequestIdDep, ServiceDep, SettingsDep
from app.protocol import ERROR_RESPONSES, SynthRequest
from app.responses import base_headers, first_chunk
from app.serving import AudioStream, SpeechJob, SpeechService
from engines.base import Audio, InvalidParameter

router = APIRouter(tags=["speech"])

_AUDIO: dict[int | str, dict[str, Any]] = {200: {"content": {CONTENT_TYPES["wav"]: {}}}}


async def _cancel_on_disconnect(request: Request, stream: AudioStream) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            stream.cancel()
            return


async def synthesize_whole(service: SpeechService, job: SpeechJob, request: Request) -> Audio:
    stream = service.run(job)
    watcher = asyncio.create_task(_cancel_on_disconnect(request, stream))
    try:
        chunks = [await first_chunk(stream)]
        chunks.extend([chunk async for chunk in stream])
    finally:
        watcher.cancel()
        await stream.aclose()
    return np.concatenate(chunks)


def _one_shot(job: SpeechJob, audio: Audio, fmt: str) -> Response:
    body = encode_whole(audio, job.sample_rate, fmt)
    headers = base_headers(job, output_rate(fmt, job.sample_rate))
    stats = job.stats.envelope(job.sample_rate, len(job.segments))
    headers["X-VoxMux-Stats"] = json.dumps(stats, separators=(",", ":"))
    return Response(body, media_type=CONTENT_TYPES[fmt], headers=headers)


@router.post("/v1/synth", responses=ERROR_RESPONSES | _AUDIO, response_class=Response)
async def synth(body: SynthRequest, request: Request, service: ServiceDep,
                settings: SettingsDep, request_id: RequestIdDep) -> Response:
    job = service.plan(
        model=body.model or settings.default_model,
        text=body.input,
        voice=body.voice_id,
        speed=body.speed,
        language=body.language,
        instructions=body.instructions,
        request_id=request_id,
    )
    return _one_shot(job, await synthesize_whole(service, job, request), body.response_format)


@router.get("/api/tts", responses=ERROR_RESPONSES | _AUDIO, response_class=Response)
async def legacy_tts(
    request: Request,
    service: ServiceDep,
    settings: SettingsDep,
    request_id: RequestIdDep,
    text: Annotated[str, Query(description="Text to speak")],
    model: Annotated[str | None, Query(description="Model id or alias")] = None,
    voice: Annotated[str | None, Query(description="Voice id or OpenAI voice name")] = None,
    speed: Annotated[float, Query(ge=0.25, le=4.0)] = 1.0,
    format: Annotated[str, Query(description="mp3, opus, aac, flac, wav or pcm")] = "wav",
) -> Response:
    if format not in FORMATS:
        raise InvalidParameter(
            f"'format' must be one of {', '.join(FORMATS)}", param="format"
        )
    job = service.plan(model=model or settings.default_model, text=text, voice=voice,
                       speed=speed, request_id=request_id)
    return _one_shot(job, await synthesize_whole(service, job, request), format)
