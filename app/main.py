"""`create_app(settings)`: wires settings, catalogue, engines, registry and routes together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.telemetry import TelemetryConfig

from app.http import edge
from app.http.auth import require_synthesis
from app.jobs.outputs import Outputs, keep_job
from app.jobs.runner import JobRunner
from app.protocols import mcp
from app.protocols.wyoming import start_server as start_wyoming
from app.routes import (
    cancel,
    captioned,
    elevenlabs,
    health,
    jobs,
    lexicons,
    models,
    monitoring,
    native,
    session,
    speech,
    studio,
    ws,
)
from app.serving import collector, tracing
from app.serving.catalogue import Catalogue
from app.serving.fleet import Fleet
from app.serving.redis_watch import RedisWatch
from app.serving.render import Renderer
from app.serving.service import SpeechService
from app.serving.wiring import build_registry, runtime_options
from app.settings import Settings
from app.text import language
from engines.onnx import check_providers

log = logging.getLogger(__name__)


async def _preload(app: FastAPI, service: SpeechService) -> None:
    try:
        for model_id in service.settings.preload:
            if model_id not in service.registry:
                log.warning("preload: unknown model %s skipped", model_id)
                continue
            try:
                await service.registry.load(model_id)
                await service.warm_up(model_id)
                log.info("preloaded %s", model_id)
            except Exception as exc:  # the model is marked error; the others keep serving
                log.error("preload of %s failed: %s", model_id, exc)
    finally:
        if service.settings.gc_freeze:  # what is loaded now, out of the collector's sight
            collector.settle(collect=True)
        app.state.ready.set()
    if service.languages is not None:  # the first request on an OpenAI name pays no load
        await asyncio.to_thread(language.load)


def create_app(settings: Settings | None = None, *, renderer: Renderer | None = None,
               fleet: Fleet | None = None) -> FastAPI:
    """The app; with a `renderer` (and the `fleet` behind it) its segments are rendered
    elsewhere (`app.cluster`), and this process loads no model."""
    settings = settings or Settings()
    catalogue = Catalogue.load(settings.catalogue_path)
    runtime = runtime_options(settings)
    if renderer is None:  # a missing CUDA shows in /health before the first model loads
        # (on a cluster the engine replicas run onnxruntime, not here)
        for providers in {tuple(settings.providers_for(m)) for m in catalogue.models}:
            check_providers(runtime.for_model(providers))
    registry = build_registry(settings, catalogue, runtime)
    service = SpeechService(settings, registry, renderer=renderer, fleet=fleet,
                            languages=catalogue.languages)
    outputs = Outputs(settings.outputs_dir) if settings.outputs_dir else None
    redis_watch = RedisWatch(settings.cache_url) if settings.cache_url else None
    runner = JobRunner(service, settings, on_done=None if outputs is None else (
        lambda store, job: keep_job(outputs, store, job, settings.chapter_pause_ms)))
    agents = mcp.build(service, runner)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.ready = asyncio.Event()
        if fleet is None:
            task = asyncio.create_task(_preload(app, service))
        else:  # the engine replicas preload; /health waits for their reports
            if settings.gc_freeze:
                collector.settle(collect=True)
            app.state.ready.set()
            task = asyncio.create_task(fleet.watch_cancels(service.cancel))
        await runner.start()
        wyoming = None  # (on a cluster, `voxmux serve --ray` serves it: app.cluster.wyoming)
        if settings.wyoming_port and fleet is None:
            wyoming = await start_wyoming(service, settings)
        try:
            async with agents.session_manager.run():
                yield
        finally:
            if wyoming is not None:
                await wyoming.stop()
            await runner.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            service.close()
            await registry.close()
            await service.cache.close()
            if redis_watch is not None:
                await redis_watch.close()

    # FastAPI's own root span per request (route, status, the caller's traceparent), with our
    # provider; VoxMux's spans and attributes are added inside it (app.serving.tracing).
    telemetry: TelemetryConfig = {
        "tracing": tracing.setup(settings), "tracer_provider": tracing.provider(),
        "metrics": False, "logs": False, "operation_spans": False, "auto_configure": False}
    app = FastAPI(title="VoxMux", version="0.1.0", lifespan=lifespan, telemetry=telemetry)
    app.state.settings = settings
    app.state.service = service
    app.state.elevenlabs_voices = catalogue.elevenlabs_voices
    app.state.runtime = runtime
    app.state.jobs = runner
    app.state.outputs = outputs
    app.state.redis_watch = redis_watch
    edge.install(app, settings)
    guarded = [Depends(require_synthesis)]  # WebSocket routes call authorize_websocket instead
    for module in (speech, captioned, models, cancel, native, jobs, lexicons):
        app.include_router(module.router, dependencies=guarded)
    for module in (health, ws, monitoring, session):
        app.include_router(module.router)
    elevenlabs.install(app)
    mcp.mount(app, agents)
    studio.install(app)
    return app
