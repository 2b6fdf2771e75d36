"""`POST /v1/audio/speech`: OpenAI's speech route, streamed as segments finish."""

from __future__ import annotations

from fastapi import APIRouter

from app.http.deps import ClientDep, RequestIdDep, ServiceDep
from app.protocols.openai import JobResponse, speech_response
from app.protocols.schemas import ERROR_RESPONSES, SpeechRequest
from engines.base import InvalidParameter

router = APIRouter(tags=["speech"])


@router.post("/v1/audio/speech", responses=ERROR_RESPONSES, response_class=JobResponse,
             status_code=200)
async def create_speech(body: SpeechRequest, service: ServiceDep, request_id: RequestIdDep,
                        client: ClientDep) -> JobResponse:
    if body.timestamps and body.stream_format != "sse":
        raise InvalidParameter("'timestamps' needs \"stream_format\": \"sse\" (raw audio has no "
                               "place for them; or use /v1/audio/captioned_speech)",
                               param="timestamps")
    plan = service.plan(**body.plan_fields(), text=body.input, request_id=request_id,
                        timestamps=body.timestamps == "word", client=client)
    return speech_response(service.speak(plan), body.response_format, body.stream_format)
