"""Lifecycle mechanics of `EngineRegistry`, driven by an engine with injectable faults.

The real engines are exercised elsewhere; here load/unload must be made slow, failing or blocking
on demand to reach the races the registry exists to prevent.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest

from engines.base import (
    Audio,
    Capabilities,
    EngineBusy,
    LoadFailed,
    ModelNotFound,
    SynthesisRequest,
    Voice,
)
from engines.registry import EngineRegistry, ModelEntry, ModelHandle, ModelStatus

WAIT = 2.0
"""Upper bound on any wait in these tests; a hang fails fast instead of stalling the suite."""


@dataclass
class Lifecycle:
    """Knobs and counters shared by every engine instance of one model."""

    load_delay: float = 0.0
    unload_delay: float = 0.0
    fail: str | None = None
    gate: threading.Event | None = None
    unload_gate: threading.Event | None = None
    loads: int = 0
    unloads: int = 0
    instances: list[FakeEngine] = field(default_factory=list)


class FakeEngine:
    name = "fake"
    sample_rate = 16_000
    capabilities = Capabilities()

    def __init__(self, life: Lifecycle) -> None:
        self.life = life
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> None:
        self.life.loads += 1
        if self.life.gate is not None:
            assert self.life.gate.wait(WAIT), "load gate never opened"
        time.sleep(self.life.load_delay)
        if self.life.fail is not None:
            raise OSError(self.life.fail)
        self._loaded = True

    def unload(self) -> None:
        if self._loaded:
            self.life.unloads += 1
        self._loaded = False  # flagged first so a racing synth sees it during the slow part
        if self.life.unload_gate is not None:
            assert self.life.unload_gate.wait(WAIT), "unload gate never opened"
        time.sleep(self.life.unload_delay)

    def voices(self) -> list[Voice]:
        return [Voice(id="v", name="v", model="fake")]

    def validate(self, req: SynthesisRequest) -> None:
        pass

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        yield self.synthesize(req)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        assert self._loaded, "synthesize on an unloaded engine"
        return np.zeros(16, dtype=np.float32)


REQ = SynthesisRequest(text="hi", voice="v")
MakeRegistry = Callable[..., tuple[EngineRegistry[None], dict[str, Lifecycle]]]


@pytest.fixture
async def make_registry() -> AsyncIterator[MakeRegistry]:
    made: list[tuple[EngineRegistry[None], dict[str, Lifecycle]]] = []

    def make(
        ttls: dict[str, float] | None = None, **kwargs: object
    ) -> tuple[EngineRegistry[None], dict[str, Lifecycle]]:
        ttls = ttls or {"a": -1}
        lives = {model_id: Lifecycle() for model_id in ttls}
        handles = [
            ModelHandle(ModelEntry(model_id, "fake", "v"), _engine(lives[model_id]), None,
                        idle_ttl=ttl)
            for model_id, ttl in ttls.items()
        ]
        registry = EngineRegistry(handles, **kwargs)  # type: ignore[arg-type]
        made.append((registry, lives))
        return registry, lives

    yield make
    for registry, lives in made:
        for life in lives.values():
            for gate in (life.gate, life.unload_gate):
                if gate is not None:
                    gate.set()
        await asyncio.wait_for(registry.close(), WAIT)


def _engine(life: Lifecycle) -> FakeEngine:
    engine = FakeEngine(life)
    life.instances.append(engine)
    return engine


async def until(predicate: Callable[[], bool], timeout: float = WAIT) -> float:
    """Poll until `predicate` holds; return the seconds it took."""
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)
    return time.monotonic() - started


def status_of(registry: EngineRegistry[None], model_id: str) -> ModelStatus:
    return registry.status()[model_id].status


def refcount_of(registry: EngineRegistry[None], model_id: str) -> int:
    return registry.status()[model_id].refcount


async def hold(registry: EngineRegistry[None], model_id: str, release: asyncio.Event) -> None:
    async with registry.lease(model_id) as engine:
        engine.synthesize(REQ)
        await release.wait()


async def holding(
    registry: EngineRegistry[None], model_id: str
) -> tuple[asyncio.Task[None], asyncio.Event]:
    """Start a task that keeps `model_id` leased until the returned event is set."""
    release = asyncio.Event()
    task = asyncio.create_task(hold(registry, model_id, release))
    await until(lambda: status_of(registry, model_id) is ModelStatus.READY)
    return task, release


async def test_concurrent_first_leases_share_one_load(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry()
    lives["a"].load_delay = 0.05

    async def use() -> None:
        async with registry.lease("a") as engine:
            engine.synthesize(REQ)

    await asyncio.wait_for(asyncio.gather(*(use() for _ in range(10))), WAIT)

    assert lives["a"].loads == 1
    state = registry.status()["a"]
    assert (state.status, state.refcount) == (ModelStatus.READY, 0)
    assert state.load_seconds is not None and state.load_seconds >= 0.05


async def test_status_is_loading_while_the_load_runs(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry()
    lives["a"].gate = threading.Event()
    task = asyncio.create_task(registry.load("a"))
    await until(lambda: status_of(registry, "a") is ModelStatus.LOADING)
    lives["a"].gate.set()
    await asyncio.wait_for(task, WAIT)
    assert status_of(registry, "a") is ModelStatus.READY


async def test_refcount_returns_to_zero_after_an_exception(make_registry: MakeRegistry) -> None:
    registry, _ = make_registry()
    with pytest.raises(ValueError):
        async with registry.lease("a"):
            assert refcount_of(registry, "a") == 1
            raise ValueError("boom")
    assert refcount_of(registry, "a") == 0


async def test_refcount_returns_to_zero_after_cancellation(make_registry: MakeRegistry) -> None:
    registry, _ = make_registry()
    task, _ = await holding(registry, "a")
    assert refcount_of(registry, "a") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT)
    assert refcount_of(registry, "a") == 0


async def test_cancelled_waiter_does_not_cancel_the_shared_load(
    make_registry: MakeRegistry,
) -> None:
    registry, lives = make_registry()
    lives["a"].gate = threading.Event()
    first = asyncio.create_task(hold(registry, "a", asyncio.Event()))
    second = asyncio.create_task(registry.load("a"))
    await until(lambda: lives["a"].loads == 1)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(first, WAIT)
    assert refcount_of(registry, "a") == 0
    lives["a"].gate.set()
    await asyncio.wait_for(second, WAIT)
    assert status_of(registry, "a") is ModelStatus.READY
    assert lives["a"].loads == 1


async def test_unload_of_busy_model_is_refused_and_changes_nothing(
    make_registry: MakeRegistry,
) -> None:
    registry, lives = make_registry()
    task, release = await holding(registry, "a")
    before = registry.status()

    with pytest.raises(EngineBusy) as refused:
        await registry.unload("a")

    assert isinstance(refused.value, EngineBusy)
    assert registry.status() == before
    assert lives["a"].unloads == 0 and lives["a"].instances[0].loaded
    release.set()
    await asyncio.wait_for(task, WAIT)
    assert await registry.unload("a") is True
    assert status_of(registry, "a") is ModelStatus.UNLOADED
    assert lives["a"].unloads == 1
    assert await registry.unload("a") is False


async def test_forced_unload_of_busy_model(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry()
    task, release = await holding(registry, "a")
    assert await registry.unload("a", force=True) is True
    assert status_of(registry, "a") is ModelStatus.UNLOADED and lives["a"].unloads == 1
    release.set()
    await asyncio.wait_for(task, WAIT)
    assert refcount_of(registry, "a") == 0


async def test_ttl_zero_unloads_at_release(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry({"a": 0})
    async with registry.lease("a"):
        pass
    await until(lambda: status_of(registry, "a") is ModelStatus.UNLOADED)
    assert lives["a"].unloads == 1


async def test_ttl_unloads_after_the_idle_time(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry({"a": 0.2})
    async with registry.lease("a"):
        pass
    assert status_of(registry, "a") is ModelStatus.READY
    waited = await until(lambda: status_of(registry, "a") is ModelStatus.UNLOADED)
    assert waited >= 0.15
    assert lives["a"].unloads == 1


async def test_lease_within_ttl_cancels_the_unload(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry({"a": 0.2})
    async with registry.lease("a"):
        pass
    await asyncio.sleep(0.1)
    async with registry.lease("a") as engine:
        await asyncio.sleep(0.25)  # past the first timer's deadline
        engine.synthesize(REQ)
    assert status_of(registry, "a") is ModelStatus.READY
    assert (lives["a"].loads, lives["a"].unloads) == (1, 0)
    await until(lambda: status_of(registry, "a") is ModelStatus.UNLOADED)


async def test_ttl_never_keeps_the_model(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry({"a": -1})
    async with registry.lease("a"):
        pass
    await asyncio.sleep(0.05)
    assert status_of(registry, "a") is ModelStatus.READY and lives["a"].unloads == 0


async def test_explicit_load_starts_the_idle_timer(make_registry: MakeRegistry) -> None:
    registry, _ = make_registry({"a": 0.05, "b": 0})
    await registry.preload(["a", "b"])
    await until(lambda: status_of(registry, "a") is ModelStatus.UNLOADED)
    assert status_of(registry, "b") is ModelStatus.READY  # TTL 0 waits for its first lease


async def test_lease_during_an_idle_unload_waits_and_gets_a_reloaded_engine(
    make_registry: MakeRegistry,
) -> None:
    registry, lives = make_registry({"a": 0})
    lives["a"].unload_gate = threading.Event()
    async with registry.lease("a"):
        pass
    await until(lambda: lives["a"].unloads == 1)  # the idle unload is now blocked in its thread
    assert status_of(registry, "a") is ModelStatus.READY  # memory not freed yet

    lease = asyncio.create_task(hold(registry, "a", asyncio.Event()))
    await asyncio.sleep(0.02)
    assert not lease.done() and lives["a"].loads == 1  # waits for the unload to finish
    lives["a"].unload_gate.set()
    await until(lambda: lives["a"].loads == 2 and refcount_of(registry, "a") == 1)
    assert status_of(registry, "a") is ModelStatus.READY and lives["a"].instances[0].loaded
    lease.cancel()


async def test_leases_racing_idle_unloads_always_get_a_loaded_engine(
    make_registry: MakeRegistry,
) -> None:
    registry, lives = make_registry({"a": 0})
    lives["a"].unload_delay = 0.002
    rng = random.Random(7)

    async def worker() -> None:
        for _ in range(25):
            await asyncio.sleep(rng.random() * 0.005)
            async with registry.lease("a") as engine:
                engine.synthesize(REQ)  # asserts the engine is loaded
                await asyncio.sleep(rng.random() * 0.001)
                engine.synthesize(REQ)

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(4))), WAIT)
    assert lives["a"].loads > 1  # the race was actually exercised
    await until(lambda: status_of(registry, "a") is ModelStatus.UNLOADED)
    assert lives["a"].unloads == lives["a"].loads
    assert not any(engine.loaded for engine in lives["a"].instances)


async def test_switch_leaves_a_busy_previous_model_loaded(make_registry: MakeRegistry) -> None:
    registry, _ = make_registry({"a": -1, "b": -1})
    await registry.switch("a")
    task, release = await holding(registry, "a")

    result = await registry.switch("b")

    assert (result.model, result.previous) == ("b", "a")
    assert result.previous_busy and not result.previous_unloaded
    assert status_of(registry, "a") is ModelStatus.READY and refcount_of(registry, "a") == 1
    assert registry.current == "b"
    release.set()
    await asyncio.wait_for(task, WAIT)


async def test_switch_unloads_an_idle_previous_model(make_registry: MakeRegistry) -> None:
    registry, _ = make_registry({"a": -1, "b": -1})
    first = await registry.switch("a")
    assert (first.previous, first.previous_unloaded, first.previous_busy) == (None, False, False)

    result = await registry.switch("b")

    assert result.previous_unloaded and not result.previous_busy
    assert status_of(registry, "a") is ModelStatus.UNLOADED
    assert status_of(registry, "b") is ModelStatus.READY
    kept = await registry.switch("a", unload_previous=False)
    assert not kept.previous_unloaded and status_of(registry, "b") is ModelStatus.READY


async def test_max_loaded_evicts_the_least_recently_used_idle_model(
    make_registry: MakeRegistry,
) -> None:
    registry, lives = make_registry({"a": -1, "b": -1, "c": -1}, max_loaded=2)
    for model_id in ("a", "b", "a"):  # b is now the least recently used
        async with registry.lease(model_id):
            pass

    async with registry.lease("c"):
        pass

    statuses = {model_id: state.status for model_id, state in registry.status().items()}
    assert statuses == {"a": "ready", "b": "unloaded", "c": "ready"}
    assert lives["b"].unloads == 1


async def test_max_loaded_skips_busy_models(make_registry: MakeRegistry) -> None:
    registry, _ = make_registry({"a": -1, "b": -1, "c": -1}, max_loaded=2)
    task, release = await holding(registry, "a")  # a is least recently used, but busy
    async with registry.lease("b"):
        pass
    async with registry.lease("c"):
        pass
    assert status_of(registry, "a") is ModelStatus.READY
    assert status_of(registry, "b") is ModelStatus.UNLOADED
    release.set()
    await asyncio.wait_for(task, WAIT)


async def test_max_loaded_is_exceeded_when_every_model_is_busy(
    make_registry: MakeRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    registry, _ = make_registry({"a": -1, "b": -1}, max_loaded=1)
    task, release = await holding(registry, "a")
    with caplog.at_level(logging.WARNING, logger="engines.registry"):
        async with registry.lease("b") as engine:
            engine.synthesize(REQ)
    assert status_of(registry, "a") is ModelStatus.READY
    assert "exceeds max_loaded=1" in caplog.text
    release.set()
    await asyncio.wait_for(task, WAIT)


async def test_load_failure_is_reported_and_retried(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry({"a": -1, "b": -1})
    lives["a"].fail = "weights missing"

    with pytest.raises(LoadFailed) as failed:
        async with registry.lease("a"):
            pytest.fail("leased a model that failed to load")

    assert isinstance(failed.value.__cause__, OSError)
    assert "weights missing" in failed.value.message
    state = registry.status()["a"]
    assert (state.status, state.error, state.refcount) == ("error", "weights missing", 0)
    async with registry.lease("b") as engine:
        engine.synthesize(REQ)

    lives["a"].fail = None
    async with registry.lease("a") as engine:
        engine.synthesize(REQ)
    state = registry.status()["a"]
    assert (state.status, state.error) == (ModelStatus.READY, None)


async def test_concurrent_leases_share_one_failed_load(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry()
    lives["a"].fail = "corrupt"
    lives["a"].load_delay = 0.02

    async def use() -> None:
        async with registry.lease("a"):
            pass

    results = await asyncio.wait_for(
        asyncio.gather(*(use() for _ in range(5)), return_exceptions=True), WAIT
    )
    assert all(isinstance(result, LoadFailed) for result in results)
    assert lives["a"].loads == 1


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.load("nope"),
        lambda r: r.unload("nope"),
        lambda r: r.switch("nope"),
        lambda r: r.preload(["nope"]),
    ],
)
async def test_unknown_model_is_not_found(
    make_registry: MakeRegistry, call: Callable[[EngineRegistry[None]], Awaitable[object]]
) -> None:
    registry, _ = make_registry()
    with pytest.raises(ModelNotFound):
        await call(registry)
    with pytest.raises(ModelNotFound) as missing:
        async with registry.lease("nope"):
            pass
    assert missing.value.param == "model"
    assert "nope" not in registry and "a" in registry


async def test_on_change_sees_every_transition(make_registry: MakeRegistry) -> None:
    seen: list[tuple[str, str]] = []
    registry, _ = make_registry(
        on_change=[lambda model_id, status: seen.append((model_id, status))]
    )
    await registry.load("a")
    await registry.unload("a")
    assert seen == [("a", "loading"), ("a", "ready"), ("a", "unloaded")]


async def test_close_unloads_everything_and_cancels_timers(make_registry: MakeRegistry) -> None:
    registry, lives = make_registry({"a": 60, "b": -1})
    for model_id in ("a", "b"):
        async with registry.lease(model_id):
            pass
    await asyncio.wait_for(registry.close(), WAIT)
    assert all(state.status == "unloaded" for state in registry.status().values())
    assert (lives["a"].unloads, lives["b"].unloads) == (1, 1)
    assert all(handle._timer is None for handle in registry.handles())


async def test_load_and_preload_make_the_model_current(make_registry: MakeRegistry) -> None:
    registry, _ = make_registry({"a": -1, "b": -1})
    await registry.preload(["a"])
    assert registry.current == "a" and registry.status()["a"].current
    result = await registry.switch("b")  # right after start: the preloaded model goes
    assert result.previous == "a" and result.previous_unloaded
    assert status_of(registry, "a") is ModelStatus.UNLOADED and registry.current == "b"
    await registry.unload("b")
    assert registry.current is None


async def test_an_unload_meeting_a_load_in_flight_is_refused_at_once(
    make_registry: MakeRegistry,
) -> None:
    registry, lives = make_registry({"a": -1})
    lives["a"].gate = threading.Event()
    load = asyncio.create_task(registry.load("a"))
    await until(lambda: status_of(registry, "a") is ModelStatus.LOADING)
    before = registry.status()
    with pytest.raises(EngineBusy, match="loading"):
        await asyncio.wait_for(registry.unload("a"), 0.5)  # never waits the load out
    assert registry.status() == before
    lives["a"].gate.set()
    await load
    assert status_of(registry, "a") is ModelStatus.READY and lives["a"].unloads == 0


async def test_an_unload_meeting_a_switch_is_refused_and_the_switch_finishes(
    make_registry: MakeRegistry,
) -> None:
    registry, lives = make_registry({"a": -1, "b": -1})
    await registry.load("a")
    lives["b"].load_delay = 0.2
    switch = asyncio.create_task(registry.switch("b"))
    refused = 0
    while not switch.done():
        try:
            await registry.unload("b")
        except EngineBusy:
            refused += 1
        await asyncio.sleep(0.02)
    result = switch.result()
    assert refused >= 3 and result.previous_unloaded and lives["b"].loads == 1
    assert status_of(registry, "b") is ModelStatus.READY and registry.current == "b"


async def test_the_model_switched_to_is_not_unloaded_while_the_switch_unloads_the_previous(
    make_registry: MakeRegistry,
) -> None:
    """The switch holds its new model until it has finished: an unload that arrives while the
    previous model is still unloading is refused (CI once unloaded `b` in that window)."""
    registry, lives = make_registry({"a": -1, "b": -1})
    await registry.load("a")
    lives["a"].unload_gate = threading.Event()
    switch = asyncio.create_task(registry.switch("b"))
    await until(lambda: status_of(registry, "b") is ModelStatus.READY)
    with pytest.raises(EngineBusy, match="switched to"):
        await registry.unload("b")
    lives["a"].unload_gate.set()
    result = await switch
    assert result.previous_unloaded and registry.current == "b"
    assert status_of(registry, "b") is ModelStatus.READY


async def test_providers_come_from_a_placed_engine_and_never_break_status(
    make_registry: MakeRegistry,
) -> None:
    registry, _ = make_registry({"a": -1, "b": -1, "c": -1})
    engines = {h.id: h.engine for h in registry.handles()}
    engines["a"].providers = lambda: ("CUDAExecutionProvider", "CPUExecutionProvider")  # type: ignore[attr-defined]
    engines["b"].providers = ("CPUExecutionProvider",)  # type: ignore[attr-defined]  # a plugin's own
    engines["c"].providers = lambda: 1 / 0  # type: ignore[attr-defined]
    assert registry.status()["a"].providers == ()  # not loaded: runs on nothing yet
    for model_id in "abc":
        await registry.load(model_id)
    status = registry.status()
    assert status["a"].providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert status["b"].providers == () and status["c"].providers == ()
