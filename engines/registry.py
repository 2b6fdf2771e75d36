"""Engine lifecycle: one handle per model, leases, refcounts, idle TTL, switching, the bound on
resident models.

The registry owns a `ModelHandle` for every model: its catalogue entry, its engine adapter, its
lifecycle state, whether it is the current model, and the lane through which requests reach it
(the lane's type is the caller's; the registry only keeps it with the rest). `lease()` is the
only way to use an engine.

It belongs to one event loop: its coroutines are called from that loop, and every blocking
engine `load()`/`unload()` runs in a worker thread. `status()` may be called from any thread.
Each handle has one `asyncio.Lock`; loads and unloads of a model take it, so an unload never
races a load, and every unload re-checks the refcount under it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from engines import heap
from engines.base import Engine, EngineBusy, Instances, LoadFailed, ModelNotFound, public_text

logger = logging.getLogger(__name__)

NEVER = -1.0
"""An idle TTL that keeps a model loaded until it is unloaded explicitly."""

L = TypeVar("L")
"""The type of a handle's lane (the serving layer's scheduler lane)."""


class ModelStatus(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    ERROR = "error"


@dataclass(frozen=True)
class ModelEntry:
    """One servable model as the catalogue describes it."""

    id: str
    engine: str
    """Name of the engine adapter that runs it."""
    default_voice: str
    description: str = ""
    aliases: tuple[str, ...] = ()
    voice_map: Mapping[str, str] = field(default_factory=dict)
    """OpenAI voice name -> the model's own voice id."""


@dataclass(frozen=True)
class ModelState:
    id: str
    status: ModelStatus
    refcount: int
    error: str | None
    load_seconds: float | None
    loaded_at: float | None
    """Wall-clock time of the last successful load."""
    last_used: float | None
    """Wall-clock time of the last lease or release."""
    current: bool
    providers: tuple[str, ...] = ()
    """Execution providers the loaded model runs on (`ModelHandle.providers`)."""
    instances: Instances | None = None
    """The sessions the loaded model runs on (`ModelHandle.instances`)."""


@dataclass(frozen=True)
class SwitchResult:
    model: str
    previous: str | None
    previous_unloaded: bool
    previous_busy: bool


ChangeCallback = Callable[[str, ModelStatus], None]


@dataclass(eq=False)
class ModelHandle(Generic[L]):
    """Everything about one model; the registry changes its state, others read it."""

    entry: ModelEntry
    engine: Engine
    """The adapter: loaded and unloaded in place, listable (voices) while unloaded."""
    lane: L
    idle_ttl: float = 600.0
    """Seconds the model may sit idle before it is unloaded: -1 never, 0 as soon as it is idle."""
    status: ModelStatus = ModelStatus.UNLOADED
    refcount: int = 0
    error: str | None = None
    load_seconds: float | None = None
    loaded_at: float | None = None
    last_used: float | None = None
    current: bool = False
    _recency: int = 0
    _usable: bool = False
    """Loaded and not being unloaded: leases may use the engine. The status stays `ready` until
    an unload has freed the memory; this turns false before the unload begins."""
    _switching: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _load_task: asyncio.Task[None] | None = None
    _timer: asyncio.TimerHandle | None = None

    def __post_init__(self) -> None:
        if self.idle_ttl < 0 and self.idle_ttl != NEVER:
            raise ValueError(f"idle_ttl must be -1, 0 or positive, not {self.idle_ttl}")

    @property
    def id(self) -> str:
        return self.entry.id

    @property
    def providers(self) -> tuple[str, ...]:
        """The onnxruntime providers the model runs on now (CUDA, or the CPU it fell back to);
        empty while it is not ready, or for an engine that does not run on one."""
        # `engines.base.Placed`'s method; a plugin's own attribute of that name is not one
        providers = getattr(self.engine, "providers", None)
        if self.status is not ModelStatus.READY or not callable(providers):
            return ()
        try:
            return tuple(providers())
        except Exception:  # a status route never fails for it
            logger.exception("model %s could not say its providers", self.id)
            return ()

    @property
    def instances(self) -> Instances | None:
        """The sessions the model runs its calls on now (`engines.base.Pooled`); None while it
        is not ready, or for an engine without a pool of sessions."""
        instances = getattr(self.engine, "instances", None)
        if self.status is not ModelStatus.READY or not callable(instances):
            return None
        try:
            found = instances()
        except Exception:  # a status route never fails for it
            logger.exception("model %s could not say its instances", self.id)
            return None
        return found if isinstance(found, Instances) else None


class EngineRegistry(Generic[L]):
    """Loads engines on demand and unloads them when idle.

    - Concurrent first leases share one load; a failed load is shared by everyone waiting on it,
      marks the model `error` with the reason, and the next lease retries it.
    - An unload is refused with `EngineBusy`, changing nothing, while the model is leased, while a
      load of it is in flight, or while a switch to it is under way; it never waits them out.
    - `max_loaded`: before a load, the least recently used idle models are unloaded until there is
      room. When every resident model is busy the load goes ahead anyway (a warning is logged): a
      request is never failed for the bound, which is briefly exceeded instead.
    - `load()`, `preload()` and `switch()` make a model the current one; an unload clears it.
      A model loaded that way starts its idle timer at once when its TTL is positive; with TTL 0
      it stays until its first lease ends.
    """

    def __init__(
        self,
        handles: Iterable[ModelHandle[L]],
        *,
        max_loaded: int | None = None,
        on_change: Iterable[ChangeCallback] = (),
    ) -> None:
        if max_loaded is not None and max_loaded < 1:
            raise ValueError("max_loaded must be at least 1")
        self._handles: dict[str, ModelHandle[L]] = {}
        self._names: dict[str, str] = {}
        for handle in handles:
            for name in (handle.id, *handle.entry.aliases):
                if name in self._names:
                    raise ValueError(f"'{name}' names both {self._names[name]} and {handle.id}")
                self._names[name] = handle.id
            self._handles[handle.id] = handle
        self.max_loaded = max_loaded
        self.on_change: list[ChangeCallback] = list(on_change)
        self._mutex = threading.Lock()
        self._recency = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._handles

    def handles(self) -> list[ModelHandle[L]]:
        return list(self._handles.values())

    @property
    def aliases(self) -> dict[str, str]:
        return {name: model_id for name, model_id in self._names.items() if name != model_id}

    def resolve(self, name: str) -> ModelHandle[L]:
        """A model id or alias -> its handle; `ModelNotFound` otherwise."""
        model_id = self._names.get(name)
        if model_id is None:
            known = ", ".join(self._names)
            raise ModelNotFound(
                f"The model '{name}' does not exist. Available: {known}", param="model"
            )
        return self._handles[model_id]

    def __getitem__(self, model_id: str) -> ModelHandle[L]:
        try:
            return self._handles[model_id]
        except KeyError:
            raise ModelNotFound(f"model {model_id!r} does not exist", param="model") from None

    @property
    def current(self) -> str | None:
        return next((h.id for h in self._handles.values() if h.current), None)

    def status(self) -> dict[str, ModelState]:
        with self._mutex:
            return {model_id: _snapshot(h) for model_id, h in self._handles.items()}

    @contextlib.asynccontextmanager
    async def lease(self, model_id: str) -> AsyncIterator[Engine]:
        handle = self[model_id]
        engine = await self._acquire(handle)
        try:
            yield engine
        finally:
            self._release(handle)

    async def load(self, model_id: str) -> None:
        """Load a model now and make it the current one."""
        handle = self[model_id]
        await self._ensure_loaded(handle)
        self._make_current(handle)
        if handle.refcount == 0 and handle.idle_ttl > 0:
            self._schedule_idle(handle)

    async def preload(self, model_ids: Iterable[str]) -> None:
        for model_id in model_ids:
            await self.load(model_id)

    async def unload(self, model_id: str, *, force: bool = False) -> bool:
        """Unload a model; `EngineBusy` if it is leased, loading or being switched to, unless
        `force` (leases may then fail). False if it was not loaded."""
        return await self._unload(self[model_id], force=force)

    async def switch(self, model_id: str, unload_previous: bool = True) -> SwitchResult:
        handle = self[model_id]
        previous = self.current
        handle._switching += 1  # until the previous model is gone too: no unload takes it first
        try:
            await self.load(model_id)
            if previous is None or previous == model_id or not unload_previous:
                return SwitchResult(model_id, previous, False, False)
            try:
                unloaded = await self.unload(previous)
            except EngineBusy:
                return SwitchResult(model_id, previous, False, True)
            return SwitchResult(model_id, previous, unloaded, False)
        finally:
            handle._switching -= 1

    async def close(self) -> None:
        """Cancel idle timers, let pending unloads finish, then unload every model."""
        for handle in self._handles.values():
            self._cancel_timer(handle)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for handle in self._handles.values():
            await self._unload(handle, force=True)

    def _make_current(self, handle: ModelHandle[L]) -> None:
        with self._mutex:
            for other in self._handles.values():
                other.current = other is handle

    async def _acquire(self, handle: ModelHandle[L]) -> Engine:
        self._cancel_timer(handle)
        with self._mutex:
            handle.refcount += 1  # before any await: from here on no idle unload may take it
        try:
            await self._ensure_loaded(handle)
        except BaseException:
            self._release(handle)
            raise
        self._touch(handle)
        return handle.engine

    def _release(self, handle: ModelHandle[L]) -> None:
        with self._mutex:
            handle.refcount -= 1
            idle = handle.refcount == 0
        self._touch(handle)
        if idle and handle._usable:
            self._schedule_idle(handle)

    def _touch(self, handle: ModelHandle[L]) -> None:
        with self._mutex:
            handle.last_used = time.time()
            handle._recency = next(self._recency)

    async def _ensure_loaded(self, handle: ModelHandle[L]) -> None:
        while not handle._usable:
            if handle._load_task is None:
                handle._load_task = self._spawn(self._load(handle))
            # Shielded: a cancelled waiter must not cancel the load the others wait for.
            await asyncio.shield(handle._load_task)

    async def _load(self, handle: ModelHandle[L]) -> None:
        try:
            async with handle._lock:
                if not handle._usable:
                    await self._load_locked(handle)
        finally:
            handle._load_task = None

    async def _load_locked(self, handle: ModelHandle[L]) -> None:
        self._set(handle, ModelStatus.LOADING)
        try:
            await self._make_room(handle)
            started = time.perf_counter()
            await asyncio.to_thread(_load_engine, handle.engine)
        except Exception as exc:
            reason = public_text(str(exc)) or type(exc).__name__
            logger.error("model %s failed to load: %s", handle.id, reason)
            self._set(handle, ModelStatus.ERROR, reason)
            raise LoadFailed(f"model {handle.id!r} failed to load: {reason}") from exc
        except BaseException:
            self._set(handle, ModelStatus.UNLOADED)  # cancelled, e.g. at loop shutdown
            raise
        with self._mutex:
            handle.load_seconds = time.perf_counter() - started
            handle.loaded_at = time.time()
        logger.info("model %s loaded in %.2f s", handle.id, handle.load_seconds)
        handle._usable = True
        self._set(handle, ModelStatus.READY)

    async def _make_room(self, handle: ModelHandle[L]) -> None:
        if self.max_loaded is None:
            return
        others = [h for h in self._handles.values() if h is not handle]
        resident = [h for h in others if h.status in (ModelStatus.READY, ModelStatus.LOADING)]
        # Only ready models are evicted: a loading one may be waiting on our lock in turn.
        ready = (h for h in resident if h.status is ModelStatus.READY and h.refcount == 0)
        idle = sorted(ready, key=lambda h: h._recency)
        excess = len(resident) + 1 - self.max_loaded
        for victim in idle:
            if excess <= 0:
                return
            with contextlib.suppress(EngineBusy):
                if await self._unload(victim, force=False):
                    excess -= 1
        if excess > 0:
            logger.warning(
                "loading %s exceeds max_loaded=%d: the other models are busy",
                handle.id,
                self.max_loaded,
            )

    def _refuse_unload(self, handle: ModelHandle[L]) -> None:
        if handle.refcount > 0:
            raise EngineBusy(f"model {handle.id!r} is in use", param="model")
        if handle._load_task is not None:
            raise EngineBusy(f"model {handle.id!r} is loading", param="model")
        if handle._switching:
            raise EngineBusy(f"model {handle.id!r} is being switched to", param="model")

    async def _unload(self, handle: ModelHandle[L], *, force: bool) -> bool:
        if not force:
            self._refuse_unload(handle)
        async with handle._lock:
            if not force:  # a lease may have arrived while another unload held the lock
                self._refuse_unload(handle)
            self._cancel_timer(handle)
            if not handle._usable:
                return False
            handle._usable = False  # a lease arriving now waits for a reload (after our lock)
            with self._mutex:
                handle.current = False
            try:
                await asyncio.to_thread(_unload_engine, handle.engine)
            except Exception:
                logger.exception("model %s failed to unload cleanly", handle.id)
            finally:
                self._set(handle, ModelStatus.UNLOADED)  # only once its memory is freed
        logger.info("model %s unloaded", handle.id)
        return True

    def _schedule_idle(self, handle: ModelHandle[L]) -> None:
        if handle.idle_ttl == NEVER:
            return
        self._cancel_timer(handle)
        loop = asyncio.get_running_loop()
        handle._timer = loop.call_later(handle.idle_ttl, self._spawn_idle_unload, handle)

    def _spawn_idle_unload(self, handle: ModelHandle[L]) -> None:
        handle._timer = None
        self._spawn(self._idle_unload(handle))

    async def _idle_unload(self, handle: ModelHandle[L]) -> None:
        with contextlib.suppress(EngineBusy):
            await self._unload(handle, force=False)

    def _cancel_timer(self, handle: ModelHandle[L]) -> None:
        if handle._timer is not None:
            handle._timer.cancel()
            handle._timer = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(_forget(self._tasks))
        return task

    def _set(self, handle: ModelHandle[L], status: ModelStatus, error: str | None = None) -> None:
        with self._mutex:
            handle.status = status
            handle.error = error
        for callback in self.on_change:
            try:
                callback(handle.id, status)
            except Exception:
                logger.exception("on_change callback failed for %s", handle.id)


def _load_engine(engine: Engine) -> None:
    try:
        engine.load()
    except BaseException:
        with contextlib.suppress(Exception):
            engine.unload()
        raise


def _unload_engine(engine: Engine) -> None:
    engine.unload()
    heap.release()


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here so a load nobody awaits logs no warning

    return done


def _snapshot(handle: ModelHandle[Any]) -> ModelState:
    return ModelState(
        id=handle.id,
        status=handle.status,
        refcount=handle.refcount,
        error=handle.error,
        load_seconds=handle.load_seconds,
        loaded_at=handle.loaded_at,
        last_used=handle.last_used,
        current=handle.current,
        providers=handle.providers,
        instances=handle.instances,
    )
