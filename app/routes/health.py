"""`GET /health`: `ok` whenever the server can serve, an idle one included (LunaVox's clients know
`ok`, `loading` and `error`); `idle: true` says that no model is loaded (the next request loads
its model). `loading` until the preloaded models are ready; `degraded` names a problem: a model
in error, CUDA asked for but missing."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.http.deps import ServiceDep
from app.protocols.schemas import Health, HealthStatus

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
async def health(request: Request, service: ServiceDep) -> Health:
    states = service.registry.status()
    models = {
        model_id: {"status": s.status, "refcount": s.refcount, "error": s.error}
        for model_id, s in states.items()
    }
    warnings = list(request.app.state.runtime.fallbacks)
    status: HealthStatus
    if not request.app.state.ready.is_set():
        status = "loading"
    elif warnings or any(s.status == "error" for s in states.values()):
        status = "degraded"
    else:
        status = "ok"
    idle = not any(s.status == "ready" for s in states.values())
    return Health(status=status, idle=idle, profile=service.settings.profile, models=models,
                  warnings=warnings)
