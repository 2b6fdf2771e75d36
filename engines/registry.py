"""Engine lifecycle: leases, refcounts, idle TTL, switching and the resident-model bound.

The registry belongs to one event loop: its coroutines are called from that loop (the FastAPI
app's), and every blocking engine `load()`/`unload()` runs in a worker thread. `status()` may be
called from any thread. Each model has one `asyncio.Lock`; loads and unloads of a model take it, so
an unload never races a load, and every unload re-checks the refcount under it.
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
from types import MappingProxyType
from typing import Any

from engines import heap
from engines.base import Engine, EngineBusy, LoadFailed, ModelNotFound

logger = logging.getLogger(__name__)

NEVER = -1.0
"""`ModelSpec.idle_ttl` that keeps a model loaded until it is unloaded explicitly."""


class ModelStatus(StrEnum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    ERROR = "error"


@dataclass(frozen=True)
class ModelSpec:
    id: str
    factory: Callable[[], Engine]
    """Builds a fresh, not yet loaded engine; called once per load."""
    idle_ttl: float = 600.0
    """Seconds a model may sit idle before it is unloaded: -1 never, 0 as soon as it is idle."""

    def __post_init__(self) -> None:
        if self.idle_ttl < 0 and self.idle_ttl != NEVER:
            raise ValueError(f"idle_ttl must be -1, 0 or positive, not {self.idle_ttl}")


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


@dataclass(frozen=True)
class SwitchResult:
    model: str
    previous: str | None
    previous_unloaded: bool
    previous_busy: bool


ChangeCallback = Callable[[str, ModelStatus], None]


@dataclass(eq=False)
class _Entry:
    spec: ModelSpec
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    status: ModelStatus = ModelStatus.UNLOADED
    engine: Engine | None = None
    refcount: int = 0
    error: str | None = None
    load_seconds: float | None = None
    loaded_at: float | None = None
    last_used: float | None = None
    recency: int = 0
    load_task: asyncio.Task[None] | None = None
    timer: asyncio.TimerHandle | None = None


class EngineRegistry:
    """Loads engines on demand and unloads them when idle; `lease()` is the only way to use one.

    - Concurrent first leases share one load; a failed load is shared by everyone waiting on it,
      marks the model `error` with the reason, and the next lease retries it.
    - An unload refused because the model is leased raises `EngineBusy` and changes nothing.
    - `max_loaded`: before a load, the least recently used idle models are unloaded until there is
      room. When every resident model is busy the load goes ahead anyway (a warning is logged): a
      request is never failed for the bound, which is briefly exceeded instead.
    - A model loaded by `load()`, `preload()` or `switch()` rather than a lease starts its idle
      timer at once when its TTL is positive; with TTL 0 it stays until its first lease ends.
    """

    def __init__(
        self,
        specs: Mapping[str, ModelSpec],
        *,
        max_loaded: int | None = None,
        on_change: Iterable[ChangeCallback] = (),
        current: str | None = None,
    ) -> None:
        for model_id, spec in specs.items():
            if model_id != spec.id:
                raise ValueError(f"spec {spec.id!r} registered under {model_id!r}")
        if max_loaded is not None and max_loaded < 1:
            raise ValueError("max_loaded must be at least 1")
        self._entries = {model_id: _Entry(spec) for model_id, spec in specs.items()}
        self.specs: Mapping[str, ModelSpec] = MappingProxyType(dict(specs))
        self.max_loaded = max_loaded
        self.on_change: list[ChangeCallback] = list(on_change)
        self.current = current
        self._mutex = threading.Lock()
        self._recency = itertools.count(1)
        self._tasks: set[asyncio.Task[Any]] = set()

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._entries

    def status(self) -> dict[str, ModelState]:
        with self._mutex:
            return {model_id: _snapshot(entry) for model_id, entry in self._entries.items()}

    @contextlib.asynccontextmanager
    async def lease(self, model_id: str) -> AsyncIterator[Engine]:
        entry = self._entry(model_id)
        engine = await self._acquire(entry)
        try:
            yield engine
        finally:
            self._release(entry)

    async def load(self, model_id: str) -> None:
        entry = self._entry(model_id)
        await self._ensure_loaded(entry)
        if entry.refcount == 0 and entry.spec.idle_ttl > 0:
            self._schedule_idle(entry)

    async def preload(self, model_ids: Iterable[str]) -> None:
        for model_id in model_ids:
            await self.load(model_id)

    async def unload(self, model_id: str, *, force: bool = False) -> bool:
        """Unload a model; `EngineBusy` if it is leased, unless `force` (leases may then fail)."""
        return await self._unload(self._entry(model_id), force=force)

    async def switch(self, model_id: str, unload_previous: bool = True) -> SwitchResult:
        previous = self.current
        await self.load(model_id)
        self.current = model_id
        if previous is None or previous == model_id or not unload_previous:
            return SwitchResult(model_id, previous, False, False)
        try:
            unloaded = await self.unload(previous)
        except EngineBusy:
            return SwitchResult(model_id, previous, False, True)
        return SwitchResult(model_id, previous, unloaded, False)

    async def close(self) -> None:
        """Cancel idle timers, let pending unloads finish, then unload every model."""
        for entry in self._entries.values():
            self._cancel_timer(entry)
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for entry in self._entries.values():
            await self._unload(entry, force=True)

    def _entry(self, model_id: str) -> _Entry:
        try:
            return self._entries[model_id]
        except KeyError:
            raise ModelNotFound(f"model {model_id!r} does not exist", param="model") from None

    async def _acquire(self, entry: _Entry) -> Engine:
        self._cancel_timer(entry)
        with self._mutex:
            entry.refcount += 1  # before any await: from here on no idle unload may take it
        try:
            engine = await self._ensure_loaded(entry)
        except BaseException:
            self._release(entry)
            raise
        self._touch(entry)
        return engine

    def _release(self, entry: _Entry) -> None:
        with self._mutex:
            entry.refcount -= 1
            idle = entry.refcount == 0
        self._touch(entry)
        if idle and entry.engine is not None:
            self._schedule_idle(entry)

    def _touch(self, entry: _Entry) -> None:
        with self._mutex:
            entry.last_used = time.time()
            entry.recency = next(self._recency)

    async def _ensure_loaded(self, entry: _Entry) -> Engine:
        while entry.engine is None or entry.status is not ModelStatus.READY:
            if entry.load_task is None:
                entry.load_task = self._spawn(self._load(entry))
            # Shielded: a cancelled waiter must not cancel the load the others wait for.
            await asyncio.shield(entry.load_task)
        return entry.engine

    async def _load(self, entry: _Entry) -> None:
        try:
            async with entry.lock:
                if entry.engine is None:
                    await self._load_locked(entry)
        finally:
            entry.load_task = None

    async def _load_locked(self, entry: _Entry) -> None:
        model_id = entry.spec.id
        self._set(entry, ModelStatus.LOADING)
        try:
            await self._make_room(entry)
            started = time.perf_counter()
            engine = await asyncio.to_thread(_build, entry.spec)
        except Exception as exc:
            reason = str(exc) or type(exc).__name__
            logger.error("model %s failed to load: %s", model_id, reason)
            self._set(entry, ModelStatus.ERROR, reason)
            raise LoadFailed(f"model {model_id!r} failed to load: {reason}") from exc
        except BaseException:
            self._set(entry, ModelStatus.UNLOADED)  # cancelled, e.g. at loop shutdown
            raise
        with self._mutex:
            entry.engine = engine
            entry.load_seconds = time.perf_counter() - started
            entry.loaded_at = time.time()
        logger.info("model %s loaded in %.2f s", model_id, entry.load_seconds)
        self._set(entry, ModelStatus.READY)

    async def _make_room(self, entry: _Entry) -> None:
        if self.max_loaded is None:
            return
        others = [e for e in self._entries.values() if e is not entry]
        resident = [e for e in others if e.status in (ModelStatus.READY, ModelStatus.LOADING)]
        # Only ready models are evicted: a loading one may be waiting on our lock in turn.
        ready = (e for e in resident if e.status is ModelStatus.READY and e.refcount == 0)
        idle = sorted(ready, key=lambda e: e.recency)
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
                entry.spec.id,
                self.max_loaded,
            )

    async def _unload(self, entry: _Entry, *, force: bool) -> bool:
        if entry.refcount > 0 and not force:
            raise EngineBusy(f"model {entry.spec.id!r} is in use", param="model")
        async with entry.lock:
            if entry.refcount > 0 and not force:  # a lease arrived while we waited
                raise EngineBusy(f"model {entry.spec.id!r} is in use", param="model")
            self._cancel_timer(entry)
            # Detached before the await: a lease arriving now reloads once we release the lock.
            engine, entry.engine = entry.engine, None
            if engine is None:
                return False
            try:
                await asyncio.to_thread(_unload_and_release, engine)
            except Exception:
                logger.exception("model %s failed to unload cleanly", entry.spec.id)
            finally:
                self._set(entry, ModelStatus.UNLOADED)  # only once its memory is freed
        logger.info("model %s unloaded", entry.spec.id)
        return True

    def _schedule_idle(self, entry: _Entry) -> None:
        ttl = entry.spec.idle_ttl
        if ttl == NEVER:
            return
        self._cancel_timer(entry)
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(ttl, self._spawn_idle_unload, entry)

    def _spawn_idle_unload(self, entry: _Entry) -> None:
        entry.timer = None
        self._spawn(self._idle_unload(entry))

    async def _idle_unload(self, entry: _Entry) -> None:
        with contextlib.suppress(EngineBusy):
            await self._unload(entry, force=False)

    def _cancel_timer(self, entry: _Entry) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(_forget(self._tasks))
        return task

    def _set(self, entry: _Entry, status: ModelStatus, error: str | None = None) -> None:
        with self._mutex:
            entry.status = status
            entry.error = error
        for callback in self.on_change:
            try:
                callback(entry.spec.id, status)
            except Exception:
                logger.exception("on_change callback failed for %s", entry.spec.id)


def _build(spec: ModelSpec) -> Engine:
    engine = spec.factory()
    try:
        engine.load()
    except BaseException:
        with contextlib.suppress(Exception):
            engine.unload()
        raise
    return engine


def _unload_and_release(engine: Engine) -> None:
    engine.unload()
    heap.release()


def _forget(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here so a load nobody awaits logs no warning

    return done


def _snapshot(entry: _Entry) -> ModelState:
    return ModelState(
        id=entry.spec.id,
        status=entry.status,
        refcount=entry.refcount,
        error=entry.error,
        load_seconds=entry.load_seconds,
        loaded_at=entry.loaded_at,
        last_used=entry.last_used,
    )
