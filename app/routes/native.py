"""One-shot routes: `POST /v1/synth` (WAV + `X-VoxMux-Stats`) and legacy `GET /api/tts`, plus
`GET /api/tts/stream`, its streamed twin (one WAV with a streaming header, sent as segments finish).

`/v1/synth` also speaks LunaVox (app.protocols.lunavox): its fields in, `X-Lunavox-Stats` out;
the legacy routes take HayaKoe's `speaker_name` as another name for `voice`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from app.audio.encoders import CONTENT_TYPES, FORMATS
from app.http.deps import ClientDep, RequestIdDep, ServiceDep, SettingsDep
from app.protocols import lunavox
from app.protocols.native import clip_response, compact, whole_clip
from app.protocols.openai import JobResponse, audio_response
from app.protocols.schemas import ERROR_RESPONSES, SynthRequest
from app.serving.plan import SpeechPlan
from engines.base import InvalidParameter

router = APIRouter(tags=["speech"])

_AUDIO: dict[int | str, dict[str, Any]] = {200: {"content": {CONTENT_TYPES["wav"]: {}}}}


@router.post("/v1/synth", responses=ERROR_RESPONSES | _AUDIO, response_class=Response)
async def synth(body: SynthRequest, request: Request, service: ServiceDep,
                request_id: RequestIdDep, client: ClientDep) -> Response:
    plan, choice = await lunavox.plan(service, body, body.input, request_id, client, whole=True)
    job = service.speak(plan)
    audio = await whole_clip(job, request)
    response = await clip_response(job, audio, body.response_format)
    response.headers["X-Lunavox-Stats"] = compact(lunavox.synth_stats(job, len(audio), choice))
    return response


def legacy_plan(whole: bool) -> Callable[..., Awaitable[SpeechPlan]]:
    """The dependency that plans what the legacy query asks for (`whole`: answered as one
    file); an unknown voice or speaker is refused."""

    async def build(
        service: ServiceDep,
        settings: SettingsDep,
        request_id: RequestIdDep,
        client: ClientDep,
        text: Annotated[str, Query(description="Text to speak")],
        model: Annotated[str | None, Query(description="Model id or alias")] = None,
        voice: Annotated[str | None, Query(description="Voice id or OpenAI voice name")] = None,
        speaker_name: Annotated[str | None, Query(description="HayaKoe's name for `voice`")
                                ] = None,
        speed: Annotated[float, Query(ge=0.25, le=4.0)] = 1.0,
    ) -> SpeechPlan:
        if voice and speaker_name and voice != speaker_name:
            raise InvalidParameter(
                "'voice' and 'speaker_name' name different voices; give one",
                param="speaker_name",
            )
        return await service.plan(model=model or settings.default_model, text=text,
                                  voice=voice or speaker_name, speed=speed,
                                  request_id=request_id, whole=whole, client=client)

    return build


WholePlanDep = Annotated[SpeechPlan, Depends(legacy_plan(whole=True))]
StreamedPlanDep = Annotated[SpeechPlan, Depends(legacy_plan(whole=False))]


@router.get("/api/tts", responses=ERROR_RESPONSES | _AUDIO, response_class=Response)
async def legacy_tts(
    request: Request,
    service: ServiceDep,
    plan: WholePlanDep,
    format: Annotated[str, Query(description="mp3, opus, aac, flac, wav or pcm")] = "wav",
) -> Response:
    if format not in FORMATS:
        raise InvalidParameter(
            f"'format' must be one of {', '.join(FORMATS)}", param="format"
        )
    job = service.speak(plan)
    return await clip_response(job, await whole_clip(job, request), format)


@router.get("/api/tts/stream", responses=ERROR_RESPONSES | _AUDIO, response_class=JobResponse,
            status_code=200)
async def legacy_tts_stream(service: ServiceDep, plan: StreamedPlanDep) -> JobResponse:
    return audio_response(service.speak(plan), "wav")
