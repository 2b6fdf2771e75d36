"""`POST /v1/audio/speech`: OpenAI's speech route, streamed as segments finish."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from app.http.deps import RequestIdDep, ServiceDep
from app.protocols.openai import audio_response, first_chunk, sse_response
from app.protocols.schemas import ERROR_RESPONSES, SpeechRequest

router = APIRouter(tags=["speech"])


@router.post("/v1/audio/speech", responses=ERROR_RESPONSES, response_class=StreamingResponse)
async def create_speech(
    body: SpeechRequest, request: Request, service: ServiceDep, request_id: RequestIdDep
) -> StreamingResponse:
    job = service.plan_options(body, body.input, request_id)
    stream = service.run(job)
    first = await first_chunk(stream, request)
    if body.stream_format == "sse":
        return sse_response(job, stream, first, body.response_format)
    return audio_response(job, stream, first, body.response_format)
