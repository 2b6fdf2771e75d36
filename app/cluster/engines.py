"""The engine deployment: replicas that hold models and render segments.

Each replica renders and nothing else: the catalogue's engine adapters in an `EngineRegistry`
(leases, loads) and a `LocalRenderer` without admission (cancellable engine calls on the lanes'
threads). Serve admits: a replica runs at most `max_ongoing_requests` (the model's concurrency)
sessions, and the rest wait in Serve's queue. Which models a replica holds is Serve's
multiplexing alone: a request carries its model as `multiplexed_model_id`, Serve routes it to a
replica that holds the model (or the one holding fewest), and past
`VOXMUX_RAY_MODELS_PER_REPLICA` evicts the least recently used; no idle TTL unloads behind its
back. onnxruntime runs as many threads per inference as the replica has CPUs (its `num_cpus`),
so replicas sharing a node do not oversubscribe it. An eviction here only retires the model: it
is unloaded when its last lease ends, so a request that streams from it is never cut short.

`render()` is one render session as a stream: `Update`s, then one `Segment` per segment or a
`Failure`. A cancel from the ingress (the client left) cancels the stream, which cancels the
session: the engine call stops at its next step and the lease is released once it has returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable

import ray
from ray import serve

from app.cluster.messages import Failure, RenderRequest, Segment, Update
from app.cluster.reports import REPORT_SECONDS, ReplicaGauges, live_replicas
from app.serving import tracing
from app.serving.catalogue import Catalogue
from app.serving.fleet import ReplicaModel, ReplicaState
from app.serving.render import LocalRenderer, Progress, RenderWork
from app.serving.scheduler import Lane
from app.serving.service import WARM_UP_TEXT
from app.settings import Settings
from engines.base import CancelToken, EngineBusy, SynthesisFailed, VoxMuxError
from engines.registry import EngineRegistry, ModelStatus

log = logging.getLogger(__name__)

CALLER_CHECK_SECONDS = 0.5
"""How often an engine replica checks that the ingress replicas it works for are alive."""
STUCK_GRACE_SECONDS = 30.0
"""An engine call this long past the request timeout has not stopped when told: stuck."""

def intra_op_threads(configured: int, cpus: float) -> int:
    """onnxruntime's threads per inference on a replica granted `cpus` CPUs: the setting when
    given, else one per whole CPU (at least one). onnxruntime's own choice, one per core of the
    node, would have every replica on a node use all of its cores."""
    return configured or max(1, int(cpus))


class Resident:
    """A model as Serve's multiplexing sees it on this replica. Serve calls `__del__` when it
    evicts the model (in a worker thread); that retires the model on the replica's loop."""

    def __init__(self, model_id: str, retire: Callable[[str], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.model_id = model_id
        self._retire = retire
        self._loop = loop
        self._gone = False

    def __del__(self) -> None:
        if self._gone:
            return
        self._gone = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: the replica is gone
            self._loop.call_soon_threadsafe(self._retire, self.model_id)


class Engines:
    async def __init__(self, settings: Settings,  # type: ignore[misc]
                       models: list[str] | None = None) -> None:
        """`models`: the only models this deployment serves (placed by resources); None: any
        the ingress sends."""
        # An async constructor (Serve awaits it): its tasks start on the replica's loop.
        from app.serving.wiring import build_registry, runtime_options  # as in one process

        self.settings = settings
        self._models = models
        tracing.setup(settings)  # from this process's environment, as the ingress's
        # Residency is Serve's multiplex LRU: no bound and no idle TTL of the registry's own.
        granted = ray.get_runtime_context().get_assigned_resources
        cpus = granted().get("CPU", 0.0)  # type: ignore[no-untyped-call]
        local = settings.model_copy(update={
            "max_loaded": None, "idle_ttl": -1, "model_ttl": {},
            "intra_op_threads": intra_op_threads(settings.intra_op_threads, cpus)})
        self.registry: EngineRegistry[Lane] = build_registry(
            local, Catalogue.load(settings.catalogue_path), runtime_options(local))
        self.renderer = LocalRenderer(self.registry, settings.request_timeout, admission=False)
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.node = ray.get_runtime_context().get_node_id()
        self._gauges = ReplicaGauges(self.node)
        self._loop = asyncio.get_running_loop()
        self._draining: set[str] = set()
        self._sessions: dict[str, dict[str, bool]] = {}
        """Model -> its render sessions on this replica -> whether each has had an engine turn
        (rendering) or still waits for one (queued): Serve admits, so the lane's own places
        are never taken."""
        self._served: Counter[str] = Counter()
        self._rendered: Counter[str] = Counter()
        self._changed = asyncio.Event()
        self._preloading = True
        self.registry.on_change.append(self._status_changed)
        async def place(model_id: str) -> Resident:  # a function: Serve keeps its LRU on it
            return await self._place(model_id)

        self.resident: Callable[[str], Awaitable[Resident]] = serve.multiplexed(
            max_num_models_per_replica=settings.ray_models_per_replica)(place)
        self._app = context.app_name
        self._calls: dict[str, tuple[str, CancelToken, asyncio.Task[None]]] = {}
        """Ticket -> the ingress replica that asked, the session's cancel and its task."""
        self._orphans = asyncio.create_task(self._stop_orphans())
        self._reporter = asyncio.create_task(self._report_loop())
        self._preload = asyncio.create_task(self._preload_models())

    # -- placement ---------------------------------------------------------------------------

    async def _place(self, model_id: str) -> Resident:
        """Serve's loader: the model is wanted here (again)."""
        self._draining.discard(model_id)
        await self.registry.load(model_id)
        self._touch()
        return Resident(model_id, self._retire, self._loop)

    def _retire(self, model_id: str) -> None:
        self._draining.add(model_id)
        self._touch()
        task = asyncio.ensure_future(self._unload_if_idle(model_id))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _unload_if_idle(self, model_id: str) -> None:
        if model_id not in self._draining or self.registry[model_id].refcount:
            return
        with contextlib.suppress(EngineBusy):  # a lease came in meanwhile: its end retries
            await self.registry.unload(model_id)
            self._draining.discard(model_id)
            log.info("model %s unloaded after its eviction", model_id)
        self._touch()

    def _serves(self, model_id: str) -> bool:
        if self._models is not None:
            return model_id in self._models
        return model_id not in self.settings.ray_model_resources

    async def _preload_models(self) -> None:
        try:
            wanted = [m for m in self.settings.preload if self._serves(m)]
            for model_id in wanted[: self.settings.ray_models_per_replica]:
                if model_id not in self.registry:
                    continue
                try:
                    await self.resident(model_id)
                    await self._warm_up(model_id)
                except Exception as exc:  # marked error in the registry; others keep serving
                    log.error("preload of %s failed: %s", model_id, exc)
        finally:
            self._preloading = False
            self._touch()

    async def _warm_up(self, model_id: str) -> None:
        entry = self.registry[model_id].entry
        work = RenderWork(ticket="warm-up", model_id=model_id, voice=entry.default_voice,
                          native_speed=1.0, stretch=1.0, language=None,
                          segments=(WARM_UP_TEXT,), cancel=CancelToken())
        async with self.renderer.session(work) as session:
            await session.render(WARM_UP_TEXT)

    # -- rendering ---------------------------------------------------------------------------

    async def render(self, request: RenderRequest) -> AsyncIterator[Update | Segment | Failure]:
        model_id = request.model_id
        try:
            await self.resident(model_id)
        except VoxMuxError as exc:
            yield Failure(exc)
            return
        items: asyncio.Queue[Update | Segment | Failure | None] = asyncio.Queue()
        cancel = CancelToken()
        task = asyncio.create_task(self._session(request, cancel, items))
        self._calls[request.ticket] = (request.caller, cancel, task)
        self._touch()
        try:
            while (item := await items.get()) is not None:
                yield item
        finally:
            self._calls.pop(request.ticket, None)
            cancel.cancel()
            if not task.done():
                task.cancel()
            while not task.done():  # the lease is released once the engine call has returned
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(task)
            await self._unload_if_idle(model_id)

    async def _session(self, request: RenderRequest, cancel: CancelToken,
                       items: asyncio.Queue[Update | Segment | Failure | None]) -> None:
        failed: list[VoxMuxError] = []

        told: list[Progress] = []
        sessions = self._sessions.setdefault(request.model_id, {})
        sessions[request.ticket] = False

        def progress(step: Progress) -> None:  # each change once ("running" comes per segment)
            if not told or told[-1] != step:
                told.append(step)
                items.put_nowait(Update(step))
                if step == "running" and request.ticket in sessions:
                    sessions[request.ticket] = True
                    self._touch()

        def abandon(error: BaseException) -> None:  # a timeout: told now, engine still stopping
            if isinstance(error, VoxMuxError) and not failed:
                failed.append(error)
                items.put_nowait(Failure(error))

        work = RenderWork(ticket=request.ticket, model_id=request.model_id, voice=request.voice,
                          native_speed=request.native_speed, stretch=request.stretch,
                          language=request.language, segments=request.segments, cancel=cancel,
                          timings=request.timings, client=request.client, progress=progress,
                          abandon=abandon)
        try:
            with tracing.continued("replica render", request.trace, {
                    "voxmux.replica": self.replica, "voxmux.model": request.model_id,
                    "voxmux.segments": len(request.segments)}):
                async with self.renderer.session(work) as session:
                    self._served[request.model_id] += 1
                    self._touch()
                    for text in request.segments:
                        rendered = await session.render(text)
                        self._rendered[request.model_id] += 1
                        items.put_nowait(Segment.of(rendered.chunks, self.replica,
                                                    rendered.words))
        except VoxMuxError as exc:
            if not failed:
                items.put_nowait(Failure(exc))
        except Exception as exc:
            log.exception("render session failed")
            items.put_nowait(Failure(SynthesisFailed(f"The engine replica failed: {exc}")))
        finally:
            sessions.pop(request.ticket, None)
            items.put_nowait(None)
            self._touch()

    async def _stop_orphans(self) -> None:
        """Every `CALLER_CHECK_SECONDS` while sessions run: a session whose ingress replica is
        no longer a live actor (it died, its node went) is stopped, its engine call told to
        stop at its next step, so a long job part or request does not render on for nobody."""
        while True:
            await asyncio.sleep(CALLER_CHECK_SECONDS)
            callers = {caller for caller, _, _ in self._calls.values() if caller}
            if not callers:
                continue
            by_deployment: dict[str, set[str]] = {}
            for caller in callers:
                deployment, _, replica = caller.partition("#")
                by_deployment.setdefault(deployment, set()).add(replica)
            try:
                alive = await asyncio.to_thread(live_replicas, self._app, set(by_deployment))
            except Exception as exc:  # the GCS busy or restarting: next time
                log.warning("could not list the ingress replicas: %s", exc)
                continue
            for ticket, (caller, cancel, task) in list(self._calls.items()):
                if caller and caller.partition("#")[2] not in alive:
                    log.warning("stopping %s: its ingress replica %s is gone", ticket, caller)
                    self._calls.pop(ticket, None)
                    cancel.cancel()
                    task.cancel()

    # -- health ------------------------------------------------------------------------------

    def check_health(self) -> None:
        """Serve's health check (every `HEALTH_PERIOD_SECONDS`): a replica fails it, and Serve
        replaces it, when an engine call has run past the request timeout and a grace (it did
        not stop when told: a hung inference holds its thread and turn for good), or when a
        model failed to load and nothing is being rendered here (a fresh process is the
        retry that cuts nobody short)."""
        limit = self.settings.request_timeout + STUCK_GRACE_SECONDS
        for handle in self.registry.handles():
            stuck = handle.lane.longest_call()
            if stuck > limit:
                raise RuntimeError(f"an engine call of '{handle.id}' has run {stuck:.0f} s, "
                                   f"past the {limit:g} s a call may take")
        errors = [h for h in self.registry.handles() if h.status is ModelStatus.ERROR]
        if errors and not any(self._sessions.values()):
            raise RuntimeError(f"'{errors[0].id}' failed to load: {errors[0].error}")

    # -- reporting ---------------------------------------------------------------------------

    def _touch(self) -> None:
        self._changed.set()

    def _status_changed(self, model_id: str, status: ModelStatus) -> None:
        self._loop.call_soon_threadsafe(self._touch)

    def state(self) -> ReplicaState:
        models = {}
        for handle in self.registry.handles():
            sessions = self._sessions.get(handle.id, {})
            running = sum(sessions.values())
            if handle.status is ModelStatus.UNLOADED and not sessions:
                continue
            models[handle.id] = ReplicaModel(
                status=handle.status, refcount=handle.refcount, error=handle.error,
                load_seconds=handle.load_seconds, running=running,
                queued=len(sessions) - running, in_flight=handle.lane.in_flight,
                slots=handle.lane.concurrency,
                draining=handle.id in self._draining,
                served=self._served[handle.id], rendered=self._rendered[handle.id],
                providers=handle.providers,
                instances=pool.count if (pool := handle.instances) else 0,
                vram_instance_mib=(pool.vram_mib or 0.0) if pool else 0.0)
        return ReplicaState(self.replica, self.node, models, self._preloading, time.time())

    async def _report_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), REPORT_SECONDS)
            self._changed.clear()
            self._gauges.publish(self.state())
            await asyncio.sleep(REPORT_SECONDS / 10)  # a burst of changes is one report

    async def __del__(self) -> None:
        self._orphans.cancel()
        self._reporter.cancel()
        self._preload.cancel()
        await self.registry.close()
