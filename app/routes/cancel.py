"""`POST /v1/audio/requests/{id}/cancel`: stop every running request that carries the id.

Clients may reuse an `X-Request-ID`, so one id can name several requests; each is cancelled.
With keys configured, cancelling needs a key (every VoxMux key is an admin key), so knowing an
id is not enough to stop someone else's request.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends

from app.http.auth import require_admin
from app.http.deps import ServiceDep
from app.http.errors import RequestNotFound
from app.protocols.schemas import ERROR_RESPONSES

router = APIRouter(tags=["speech"])


@router.post("/v1/audio/requests/{request_id}/cancel", responses=ERROR_RESPONSES,
             dependencies=[Depends(require_admin)])
async def cancel_request(request_id: str, service: ServiceDep) -> dict[str, object]:
    cancelled = await service.cancel_everywhere(request_id)
    if not cancelled:
        raise RequestNotFound(f"No running request '{request_id}'", param="request_id")
    return {"id": request_id, "cancelled": True, "requests": cancelled}
