"""`POST /v1/audio/requests/{id}/cancel`: stop a running request's remaining segments."""

from __future__ import annotations

from fastapi import APIRouter

from app.http.deps import ServiceDep
from app.protocols.schemas import ERROR_RESPONSES
from engines.base import VoxMuxError

router = APIRouter(tags=["speech"])


class RequestNotFound(VoxMuxError):
    """No running request has that id."""

    status = 404
    type = "invalid_request_error"
    code = "request_not_found"


@router.post("/v1/audio/requests/{request_id}/cancel", responses=ERROR_RESPONSES)
async def cancel_request(request_id: str, service: ServiceDep) -> dict[str, object]:
    if not service.cancel(request_id):
        raise RequestNotFound(f"No running request '{request_id}'", param="request_id")
    return {"id": request_id, "cancelled": True}
