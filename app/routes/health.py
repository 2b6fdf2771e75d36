"""`GET /health`: `ok` whenever the server can serve, an idle one included (LunaVox's clients know
`ok`, `loading` and `error`); `idle: true` says that no model is loaded (the next request loads
its model). `loading` until the preloaded models are ready; `degraded` names a problem: a model
in error, CUDA asked for but missing, a Redis (`VOXMUX_CACHE_URL`) that does not answer. Each
model says which onnxruntime providers it really runs on (`providers`: CUDA first, or only the
CPU it fell back to; empty while unloaded and for eSpeak NG, which runs on the host CPU), how
many sessions of its graph run calls at once (`instances`, `VOXMUX_INSTANCES`), and the VRAM
each took as it opened (`vram_per_instance_mib`; null on CPU or where NVML cannot tell, with
`vram_note` saying which)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.http.deps import ServiceDep
from app.protocols.schemas import Health, HealthStatus
from app.serving.service import cluster_report

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health)
async def health(request: Request, service: ServiceDep) -> Health:
    replicas = await service.replicas()
    views = await service.model_views(replicas)
    models = {
        model_id: {"status": v.status, "refcount": v.refcount, "error": v.error,
                   "providers": list(v.providers), "instances": v.instances,
                   "vram_per_instance_mib": v.vram_per_instance_mib,
                   "vram_note": v.vram_note or None}
        for model_id, v in views.items()
    }
    warnings = list(request.app.state.runtime.fallbacks)
    if request.app.state.redis_watch is not None:
        problem = await request.app.state.redis_watch.problem()
        if problem is not None:
            warnings.append(problem)
    ready = request.app.state.ready.is_set()
    cluster = None
    if replicas is not None and service.fleet is not None:
        deployment = await service.fleet.deployment()
        cluster = cluster_report(replicas, deployment, service.shared_state())
        # A replica added by autoscaling preloads while the others serve.
        ready = ready and any(not r.preloading for r in replicas)
        if deployment.status == "UNHEALTHY":
            warnings.append(f"the engine deployment is unhealthy: {deployment.message}")
        elif ready and len(replicas) < deployment.running:
            warnings.append(f"{len(replicas)} of {deployment.running} running engine replicas "
                            "are reporting")
    status: HealthStatus
    if not ready:
        status = "loading"
    elif warnings or any(v.status == "error" for v in views.values()):
        status = "degraded"
    else:
        status = "ok"
    idle = not any(v.status == "ready" for v in views.values())
    return Health(status=status, idle=idle, profile=service.settings.profile, models=models,
                  warnings=warnings, cluster=cluster)
