"""`GET /stats` and `GET /requests` (admin), `GET /metrics` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from app.http.auth import require_admin, require_synthesis
from app.http.deps import ServiceDep
from app.protocols.schemas import ERROR_RESPONSES
from app.serving.metrics import CONTENT_TYPE

router = APIRouter(tags=["monitoring"])


@router.get("/stats", dependencies=[Depends(require_admin)], responses=ERROR_RESPONSES)
async def stats(service: ServiceDep) -> dict[str, object]:
    return await service.report()


@router.get("/requests", dependencies=[Depends(require_admin)], responses=ERROR_RESPONSES)
async def requests(service: ServiceDep) -> dict[str, object]:
    return {"object": "list", "data": service.stats.requests(service.queue_position)}


@router.get("/metrics", dependencies=[Depends(require_synthesis)], response_class=Response)
async def metrics(service: ServiceDep) -> Response:
    return Response(await service.metrics_text(), media_type=CONTENT_TYPE)
