"""`POST /v1/audio/captioned_speech` and Kokoro-FastAPI's `POST /dev/captioned_speech`: speech
with word timings, as one JSON object or streamed as newline-delimited JSON."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.http.deps import ClientDep, RequestIdDep, ServiceDep
from app.protocols import captioned
from app.protocols.schemas import ERROR_RESPONSES, CaptionedSpeechRequest

router = APIRouter(tags=["speech"])


@router.post("/v1/audio/captioned_speech", responses=ERROR_RESPONSES, response_class=Response)
@router.post("/dev/captioned_speech", responses=ERROR_RESPONSES, response_class=Response,
             include_in_schema=False)
async def captioned_speech(body: CaptionedSpeechRequest, request: Request,
                           service: ServiceDep, request_id: RequestIdDep, client: ClientDep
                           ) -> Response:
    timed = body.return_timestamps or body.captions is not None
    plan = await service.plan(**body.plan_fields(), text=body.input, request_id=request_id,
                              timestamps=timed, whole=not body.stream, client=client)
    job = service.speak(plan)
    if body.stream:
        return captioned.stream_response(job, body.response_format, body.captions)
    return await captioned.whole_response(job, body.response_format, body.captions, request)
