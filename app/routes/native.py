"""One-shot routes: `POST /v1/synth` (WAV + `X-VoxMux-Stats`) and legacy `GET /api/tts`, plus
`GET /api/tts/stream`, its streamed twin (one WAV with a streaming header, sent as segments finish).

A one-shot clip is synthesized whole before the response starts, so every failure keeps its
status and the stats headers can hold end-of-request figures. A client that hangs up meanwhile
cancels it. `/v1/synth` also speaks LunaVox (app.protocols.lunavox): its fields in,
`X-Lunavox-Stats` out; the legacy routes take HayaKoe's `speaker_name` as another name for `voice`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response, StreamingResponse

from app.audio.encoders import CONTENT_TYPES, FORMATS, encode_whole, output_rate
from app.http.deps import RequestIdDep, ServiceDep, SettingsDep
from app.protocols import lunavox
from app.protocols.openai import audio_response, base_headers, cancel_on_disconnect, first_chunk
from app.protocols.schemas import ERROR_RESPONSES, SynthRequest
from app.serving.service import SpeechJob, SpeechService
from engines.base import Audio, InvalidParameter

router = APIRouter(tags=["speech"])

_AUDIO: dict[int | str, dict[str, Any]] = {200: {"content": {CONTENT_TYPES["wav"]: {}}}}


async def synthesize_whole(service: SpeechService, job: SpeechJob, request: Request) -> Audio:
    stream = service.run(job)
    watcher = asyncio.create_task(cancel_on_disconnect(request, stream))
    try:
        chunks = [await first_chunk(stream)]
        chunks.extend([chunk async for chunk in stream])
    finally:
        watcher.cancel()
        await stream.aclose()
    return np.concatenate(chunks)


async def _one_shot(job: SpeechJob, audio: Audio, fmt: str) -> Response:
    # A whole clip through LAME or Opus takes long enough to stall every other stream.
    body = await asyncio.to_thread(encode_whole, audio, job.sample_rate, fmt)
    headers = base_headers(job, output_rate(fmt, job.sample_rate))
    stats = job.stats.envelope(job.sample_rate, len(job.segments))
    headers["X-VoxMux-Stats"] = _compact(stats)
    return Response(body, media_type=CONTENT_TYPES[fmt], headers=headers)


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


@router.post("/v1/synth", responses=ERROR_RESPONSES | _AUDIO, response_class=Response)
async def synth(body: SynthRequest, request: Request, service: ServiceDep,
                request_id: RequestIdDep) -> Response:
    job, choice = lunavox.plan(service, body, body.input, request_id)
    audio = await synthesize_whole(service, job, request)
    response = await _one_shot(job, audio, body.response_format)
    response.headers["X-Lunavox-Stats"] = _compact(lunavox.synth_stats(job, len(audio), choice))
    return response


def legacy_job(
    service: ServiceDep,
    settings: SettingsDep,
    request_id: RequestIdDep,
    text: Annotated[str, Query(description="Text to speak")],
    model: Annotated[str | None, Query(description="Model id or alias")] = None,
    voice: Annotated[str | None, Query(description="Voice id or OpenAI voice name")] = None,
    speaker_name: Annotated[str | None, Query(description="HayaKoe's name for `voice`")] = None,
    speed: Annotated[float, Query(ge=0.25, le=4.0)] = 1.0,
) -> SpeechJob:
    """The job the legacy query asks for; an unknown voice or speaker is a 404."""
    if voice and speaker_name and voice != speaker_name:
        raise InvalidParameter(
            "'voice' and 'speaker_name' name different voices; give one", param="speaker_name"
        )
    return service.plan(model=model or settings.default_model, text=text,
                        voice=voice or speaker_name, speed=speed, request_id=request_id)


LegacyJobDep = Annotated[SpeechJob, Depends(legacy_job)]


@router.get("/api/tts", responses=ERROR_RESPONSES | _AUDIO, response_class=Response)
async def legacy_tts(
    request: Request,
    service: ServiceDep,
    job: LegacyJobDep,
    format: Annotated[str, Query(description="mp3, opus, aac, flac, wav or pcm")] = "wav",
) -> Response:
    if format not in FORMATS:
        raise InvalidParameter(
            f"'format' must be one of {', '.join(FORMATS)}", param="format"
        )
    return await _one_shot(job, await synthesize_whole(service, job, request), format)


@router.get("/api/tts/stream", responses=ERROR_RESPONSES | _AUDIO,
            response_class=StreamingResponse)
async def legacy_tts_stream(request: Request, service: ServiceDep, job: LegacyJobDep
                            ) -> StreamingResponse:
    stream = service.run(job)
    return audio_response(job, stream, await first_chunk(stream, request), "wav")
