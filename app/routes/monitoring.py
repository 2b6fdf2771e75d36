"""`GET /stats` and `GET /requests` (admin), `GET /metrics` (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from app.http.auth import require_admin, require_synthesis
from app.http.deps import ServiceDep
from app.protocols.schemas import ERROR_RESPONSES
from app.serving.memory import process_memory
from app.serving.metrics import CONTENT_TYPE
from app.serving.service import SpeechService

router = APIRouter(tags=["monitoring"])


def stats_report(service: SpeechService) -> dict[str, object]:
    lanes = service.scheduler.lanes()
    models: dict[str, object] = {}
    for model_id, state in service.registry.status().items():
        lane = lanes.get(model_id)
        models[model_id] = {
            "status": state.status,
            "refcount": state.refcount,
            "load_seconds": state.load_seconds,
            "active": lane.running if lane else 0,
            "queued": lane.queued if lane else 0,
        }
    return {
        **service.stats.snapshot(),
        "active": service.scheduler.active,
        "queued": service.scheduler.queued,
        "cache": service.cache.snapshot(),
        "models": models,
        "memory": process_memory(),
    }


@router.get("/stats", dependencies=[Depends(require_admin)], responses=ERROR_RESPONSES)
async def stats(service: ServiceDep) -> dict[str, object]:
    return stats_report(service)


@router.get("/requests", dependencies=[Depends(require_admin)], responses=ERROR_RESPONSES)
async def requests(service: ServiceDep) -> dict[str, object]:
    return {"object": "list", "data": service.stats.requests(service.queue_position)}


@router.get("/metrics", dependencies=[Depends(require_synthesis)], response_class=Response)
async def metrics(service: ServiceDep) -> Response:
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)
