"""What the models are doing, wherever they run: one view for the status routes.

In a single process the registry and the lanes say it. On a cluster each engine replica reports
its own registry and lanes (`ReplicaState`), and a `Fleet` gathers the reports; `model_views`
folds them into one `ModelView` per model, so `/v1/models`, `/health`, `/stats`, `/metrics` and
the Studio read the same shape either way and the cluster adds which replica holds what.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from app.serving.scheduler import Lane
from engines.onnx import CUDA
from engines.registry import ModelHandle, ModelStatus


@dataclass(frozen=True)
class ReplicaModel:
    """One model on one engine replica."""

    status: ModelStatus
    refcount: int
    error: str | None
    load_seconds: float | None
    running: int
    """Admitted requests that have had their first turn."""
    queued: int
    """Admitted requests waiting for their first turn."""
    in_flight: int
    """Engine calls running now."""
    slots: int = 0
    """Engine calls the model runs at once here (the lane's concurrency)."""
    draining: bool = False
    """Evicted by the cluster's placement while requests still stream from it: it unloads when
    the last of them ends."""
    served: int = 0
    """Render sessions (requests, or sentences of streamed text) this replica has run for the
    model."""
    rendered: int = 0
    """Segments this replica has rendered for the model."""
    providers: tuple[str, ...] = ()
    """onnxruntime providers the model runs on here (`ModelHandle.providers`)."""
    instances: int = 0
    """Sessions of its graph it runs calls on here (`ModelHandle.instances`); 0: none reported
    (not ready, or an engine without a pool)."""
    vram_instance_mib: float = 0.0
    """VRAM one of those sessions took; 0: unknown, or not on CUDA."""


@dataclass(frozen=True)
class ReplicaState:
    """One engine replica's report."""

    id: str
    node: str
    models: dict[str, ReplicaModel]
    preloading: bool = False
    updated: float = 0.0
    """Wall-clock time of the report."""

    @property
    def holds(self) -> list[str]:
        """Models loaded (or loading) here."""
        return [m for m, s in self.models.items()
                if s.status in (ModelStatus.READY, ModelStatus.LOADING)]


@dataclass(frozen=True)
class DeploymentStatus:
    """The engine deployment as the cluster's scheduler (Serve) sees it."""

    status: str
    """HEALTHY, UPDATING, UPSCALING, DOWNSCALING, UNHEALTHY, ... (Serve's words)."""
    replica_states: dict[str, int]
    """Replicas by state: RUNNING, STARTING, STOPPING, ..."""
    message: str = ""

    @property
    def running(self) -> int:
        return self.replica_states.get("RUNNING", 0)


class Fleet(Protocol):
    """The engine replicas of a cluster, as the ingress sees them."""

    shared_cancel: bool
    """Whether a cancel by id reaches the requests of the other ingress replicas."""

    async def replicas(self) -> list[ReplicaState]: ...

    async def deployment(self) -> DeploymentStatus: ...

    def routing(self) -> dict[str, int]:
        """This ingress's requests that wait for an engine replica with room, by model."""

    async def load(self, model_id: str, voice: str) -> None:
        """Load a model on the replica the cluster routes it to (rendering a word in `voice`)."""

    async def cancel(self, request_id: str) -> int:
        """Cancel `request_id` on the other ingress replicas; how many requests that was."""

    async def watch_cancels(self, cancel: Callable[[str], int]) -> None:
        """Run `cancel` for every request id another replica was asked to cancel; forever."""


@dataclass(frozen=True)
class ModelView:
    status: ModelStatus
    refcount: int
    """Leases held now (requests using the model)."""
    error: str | None
    load_seconds: float | None
    current: bool
    running: int
    queued: int
    in_flight: int
    replicas: tuple[str, ...] | None = None
    """On a cluster: the engine replicas holding the model."""
    slots: int = 0
    """Engine calls the model can run at once (summed over the replicas that have it ready)."""
    providers: tuple[str, ...] = ()
    """onnxruntime providers the model runs on (on a cluster: on any replica, in order of first
    mention); empty while not ready and for engines that use none."""
    instances: int | None = None
    """Sessions of its graph that run calls at once (on a cluster: on each replica); None while
    not ready and for engines without a pool of sessions."""
    vram_per_instance_mib: float | None = None
    """VRAM one of those sessions took as it opened; None off CUDA or where NVML cannot tell,
    `vram_note` saying which."""
    vram_note: str = ""


def local_views(handles: Iterable[ModelHandle[Lane]]) -> dict[str, ModelView]:
    views = {}
    for handle in handles:
        lane = handle.lane.state()
        pool = handle.instances
        views[handle.id] = ModelView(handle.status, handle.refcount, handle.error,
                                     handle.load_seconds, handle.current, lane.running,
                                     lane.queued, lane.in_flight, slots=handle.lane.concurrency,
                                     providers=handle.providers,
                                     instances=pool.count if pool else None,
                                     vram_per_instance_mib=pool.vram_mib if pool else None,
                                     vram_note=pool.vram_note if pool else "")
    return views


_PRECEDENCE = (ModelStatus.READY, ModelStatus.LOADING, ModelStatus.ERROR)


def fleet_views(model_ids: Iterable[str], replicas: list[ReplicaState],
                routing: dict[str, int] | None = None) -> dict[str, ModelView]:
    """One view per model over every replica: ready where any replica has it ready, else
    loading, else error (with a replica's reason), else unloaded; counts are summed, and the
    requests still `routing` to a replica (waiting in Serve's queue) count as queued."""
    routing = routing or {}
    views = {}
    for model_id in model_ids:
        states = [(r.id, r.models[model_id]) for r in replicas if model_id in r.models]
        found = {s.status for _, s in states}
        status = next((s for s in _PRECEDENCE if s in found), ModelStatus.UNLOADED)
        error = next((s.error for _, s in states if s.error), None)
        loads = [s.load_seconds for _, s in states if s.load_seconds is not None]
        holders = tuple(rid for rid, s in states
                        if s.status in (ModelStatus.READY, ModelStatus.LOADING))
        providers = tuple(dict.fromkeys(p for _, s in states for p in s.providers))
        instances = max((s.instances for _, s in states), default=0)
        vram = max((s.vram_instance_mib for _, s in states), default=0.0)
        note = "" if vram or not instances else (
            "runs on the CPU" if CUDA not in providers else "not reported by the replicas")
        views[model_id] = ModelView(
            status=status,
            refcount=sum(s.refcount for _, s in states),
            error=error if status is ModelStatus.ERROR else None,
            load_seconds=max(loads) if loads else None,
            current=False,
            running=sum(s.running for _, s in states),
            queued=sum(s.queued for _, s in states) + routing.get(model_id, 0),
            in_flight=sum(s.in_flight for _, s in states),
            replicas=holders,
            slots=sum(s.slots for _, s in states if s.status is ModelStatus.READY),
            providers=providers,
            instances=instances or None,
            vram_per_instance_mib=vram or None,
            vram_note=note,
        )
    return views
