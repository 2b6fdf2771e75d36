"""The engines of one process, wired from its settings: the catalogue's models as registry
handles (engine, lane, idle TTL) and the onnxruntime options they open their sessions with.

The server (`app.main`), the command line (`app.cli.local`, `voxmux doctor`) and a cluster's
engine replicas wire their engines here alike; this module imports no web framework, so a command
that speaks without a server starts without one.
"""

from __future__ import annotations

from app.serving.catalogue import Catalogue
from app.serving.scheduler import Lane
from app.settings import Settings
from engines.base import lane_concurrency
from engines.onnx import CUDA, RuntimeOptions, usable_cores
from engines.plugin import UnknownEngine, build_engine
from engines.registry import EngineRegistry, ModelEntry, ModelHandle


def build_registry(settings: Settings, catalogue: Catalogue, runtime: RuntimeOptions
                   ) -> EngineRegistry[Lane]:
    """One handle per catalogue model: the engine class its entry names (`engines.plugin`),
    built from the settings, and its lane."""
    def handle(entry: ModelEntry) -> ModelHandle[Lane]:
        own = runtime.for_model(settings.providers_for(entry.id), settings.instances_for(entry.id))
        try:
            engine = build_engine(entry.engine, settings, own)
        except UnknownEngine as exc:
            raise ValueError(f"catalogue: model {entry.id}: {exc}") from exc
        turns = lane_concurrency(settings.concurrency, engine.capabilities, usable_cores(),
                                 settings.engine_batch)
        lane = Lane(entry.id, turns, settings.queue_size, settings.client_places)
        return ModelHandle(entry, engine, lane, idle_ttl=settings.ttl_for(entry.id))

    return EngineRegistry([handle(e) for e in catalogue.models.values()],
                          max_loaded=settings.max_loaded)


def runtime_options(settings: Settings) -> RuntimeOptions:
    return RuntimeOptions(
        providers=tuple(settings.providers),
        intra_op_threads=settings.intra_op_threads,
        spinning=settings.intra_op_spinning,
        batch_size=settings.engine_batch,
        batch_wait=settings.engine_batch_wait_ms / 1000,
        provider_options={CUDA: dict(settings.cuda_options)} if settings.cuda_options else {},
    )
