"""`POST /v1/audio/speech`: OpenAI's speech route, streamed as segments finish."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.http.deps import ClientDep, RequestIdDep, ServiceDep
from app.protocols.openai import JobResponse, speech_response
from app.protocols.schemas import ERROR_RESPONSES, SpeechRequest
from engines.base import InvalidParameter

router = APIRouter(tags=["speech"])


@router.post("/v1/audio/speech", responses=ERROR_RESPONSES, response_class=JobResponse,
             status_code=200)
async def create_speech(body: SpeechRequest, request: Request, service: ServiceDep,
                        request_id: RequestIdDep, client: ClientDep) -> JobResponse:
    if body.timestamps and body.stream_format != "sse":
        raise InvalidParameter("'timestamps' needs \"stream_format\": \"sse\" (raw audio has no "
                               "place for them; or use /v1/audio/captioned_speech)",
                               param="timestamps")
    plan = await service.plan(**body.plan_fields(), text=body.input, request_id=request_id,
                              timestamps=body.timestamps == "word", client=client)
    response = speech_response(service.speak(plan), body.response_format, body.stream_format)
    outputs = request.app.state.outputs
    if outputs is not None and body.stream_format == "audio":
        sidecar = {"route": "/v1/audio/speech", "request_id": plan.request_id,
                   "model": body.model, "model_id": plan.model_id, "voice": plan.voice,
                   "speed": body.speed, "format": body.response_format,
                   "chars": len(body.input), "input": body.input}
        response.keep = lambda data: outputs.write(f"speech-{plan.request_id}",
                                                   body.response_format, data, sidecar)
    return response
