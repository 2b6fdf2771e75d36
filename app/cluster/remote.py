"""The ingress's side of rendering on a cluster: a `Renderer` and a `Fleet` over Serve handles.

A render session is one streaming call to the engine deployment, routed by the request's model
(`multiplexed_model_id`) to a replica that holds it; for streamed text (segments not known up
front) each sentence is a call of its own. Serve's queue in front of the replicas is bounded
(`max_queued_requests`): a full one is the same `Overloaded` (429 with `Retry-After`) as a full
lane. Leaving the session early (the client left, a cancel) cancels the call, which cancels the
replica's session and with it the running engine call. Failures on the replica arrive as the very
errors the single process raises. A replica that dies before a call's engine work began (the
call waited in its queue) costs nothing but time: the call is sent again (Serve routes it to a
live replica, or waits for the dead one's replacement). One that dies later ends the request with
a `SynthesisFailed` (an SSE `error` event, a WebSocket `error` frame, a cut chunked body), and the
call is never sent again, since it may be what killed the replica; one that stops answering ends
it with a `RequestTimeout`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from ray.exceptions import RayActorError, RayError
from ray.serve.exceptions import BackPressureError

from app.cluster.cancels import Cancels
from app.cluster.messages import Failure, RenderRequest, Segment, Update
from app.cluster.reports import REPORT_SECONDS, live_replicas, read_replicas
from app.serving import tracing
from app.serving.fleet import DeploymentStatus, ReplicaState
from app.serving.render import Rendered, RenderSession, RenderWork
from engines.base import EngineLost, Overloaded, RequestTimeout, SynthesisFailed
from engines.registry import ModelStatus

log = logging.getLogger(__name__)

RETRIES = 2
"""Times a call that a lost replica never answered is sent again."""
REPORT_WAIT_SECONDS = 5.0
"""How long a load waits for the replica's report before answering."""
GRACE_SECONDS = 10.0
"""Added to the request timeout before the ingress gives up on a replica that sends nothing (the
replica's own timeout, which reports a 504, comes first)."""


class RayRenderer:
    """`Renderer` and `Fleet` of an ingress replica: render sessions are calls to the engine
    deployment, its status is Serve's (`serve.status()`) and the replicas' own metrics
    (`app.cluster.reports`), cancels travel through `cancels`."""

    def __init__(self, engines: Any, cancels: Cancels, timeout: float,
                 placed: dict[str, Any] | None = None, caller: str = "") -> None:
        self._engines = engines
        self._placed = placed or {}
        """Handles of the engine deployments of models placed by resources."""
        self._cancels = cancels
        self.shared_cancel = cancels.shared
        self.timeout = timeout
        self.caller = caller
        """This ingress replica as the engine replicas know it (`RenderRequest.caller`)."""
        self._mean_seconds = 1.0
        self._status_lock = asyncio.Lock()
        self._replicas: list[ReplicaState] = []
        self._read_at: float | None = None
        self._routing: Counter[str] = Counter()
        """Calls handed to Serve that no engine replica has taken yet, by model."""

    @asynccontextmanager
    async def session(self, work: RenderWork) -> AsyncIterator[RenderSession]:
        session = _RaySession(self, work)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            yield session
        finally:
            session.close()
            self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (loop.time() - started)

    def call(self, work: RenderWork, segments: tuple[str, ...]) -> Any:
        request = RenderRequest(work.ticket, work.model_id, work.voice, work.native_speed,
                                work.stretch, work.language, segments, work.timings, work.client,
                                self.caller, tracing.carrier())
        handle = self._placed.get(work.model_id, self._engines)
        options = handle.options(multiplexed_model_id=work.model_id, stream=True)
        return options.render.remote(request)

    def retry_after(self) -> int:
        return max(1, math.ceil(self._mean_seconds))

    def routing(self) -> dict[str, int]:
        """Requests of this ingress replica waiting in Serve's router for an engine replica
        with room (a replica answers a call it takes at once: its first progress update)."""
        return {model: n for model, n in self._routing.items() if n > 0}

    def routed(self, model_id: str, waiting: bool) -> None:
        self._routing[model_id] += 1 if waiting else -1

    # -- status ------------------------------------------------------------------------------

    def _deployments(self) -> list[str]:
        return [h.deployment_name for h in (self._engines, *self._placed.values())]

    async def replicas(self) -> list[ReplicaState]:
        """The engine replicas that are alive now, as they last reported: read at most once a
        `REPORT_SECONDS` however many status reads and jobs ask (every node's metrics endpoint
        is scraped), and only those Ray still lists (a killed replica's last report stayed
        fresh for 15 s)."""
        async with self._status_lock:
            loop = asyncio.get_running_loop()
            if self._read_at is None or loop.time() - self._read_at >= REPORT_SECONDS:
                app, deployments = self._engines.app_name, set(self._deployments())
                reports = await read_replicas(app, deployments)
                alive = await asyncio.to_thread(live_replicas, app, deployments)
                self._replicas = [r for r in reports if r.id in alive]
                self._read_at = loop.time()
            return self._replicas

    async def deployment(self) -> DeploymentStatus:
        """The engine deployments as one: the worst status, replicas by state summed."""
        from ray import serve

        status = await asyncio.to_thread(serve.status)
        app = status.applications.get(self._engines.app_name)
        found = [app.deployments[name] for name in self._deployments()
                 if app is not None and name in app.deployments]
        if not found:
            return DeploymentStatus("NOT_FOUND", {}, "the engine deployment is not running")
        states: Counter[str] = Counter()
        for engines in found:
            states.update({str(getattr(state, "value", state)): count
                           for state, count in engines.replica_states.items()})
        statuses = [str(e.status.value) for e in found]
        worst = next((s for s in ("UNHEALTHY", "DEPLOY_FAILED", "UPDATING", "UPSCALING",
                                  "DOWNSCALING") if s in statuses), statuses[0])
        return DeploymentStatus(worst, dict(states),
                                "; ".join(e.message for e in found if e.message))

    async def cancel(self, request_id: str) -> int:
        return await self._cancels.cancel(request_id)

    async def watch_cancels(self, cancel: Callable[[str], int]) -> None:
        await self._cancels.watch(cancel)

    async def load(self, model_id: str, voice: str) -> None:
        """Load a model where the cluster routes it: a one-segment render session, so its
        failure is the same error a request would get."""
        from app.serving.service import WARM_UP_TEXT
        from engines.base import CancelToken

        work = RenderWork(ticket=f"load-{model_id}", model_id=model_id, voice=voice,
                          native_speed=1.0, stretch=1.0, language=None, segments=None,
                          cancel=CancelToken())
        async with self.session(work) as session:
            await session.render(WARM_UP_TEXT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPORT_WAIT_SECONDS  # until a report shows it, so the answer does
        while loop.time() < deadline:
            replicas = await self.replicas()
            if any(r.models.get(model_id) and r.models[model_id].status is ModelStatus.READY
                   for r in replicas):
                return
            await asyncio.sleep(0.1)


class _ReplicaLost(Exception):
    """The replica running the call died or became unreachable."""


class _RaySession:
    def __init__(self, renderer: RayRenderer, work: RenderWork) -> None:
        self._renderer = renderer
        self._work = work
        self._stream: Any = None
        self._segments: tuple[str, ...] = ()
        self._pending: list[str] = []
        self._ended = True
        self._answered = False
        """Whether the current call has sent a segment."""
        self._started = False
        """Whether the current call's engine work began: a replica lost after that is not sent
        the call again (the call may be what ended it: an engine that runs out of memory or
        crashes on this input would end the next replica too)."""
        self._retries = 0
        self._routing = False
        """Whether the current call waits in Serve's router (counted in `RayRenderer.routing`)."""

    def _call(self, segments: tuple[str, ...]) -> None:
        with self._mapped():
            self._stream = self._renderer.call(self._work, segments)
        self._segments, self._ended = segments, False
        self._answered = self._started = False
        self._route(True)

    def _route(self, waiting: bool) -> None:
        if waiting != self._routing:
            self._routing = waiting
            self._renderer.routed(self._work.model_id, waiting)

    async def render(self, text: str) -> Rendered:
        work = self._work
        if not self._pending:
            await self._finish_stream()
            segments = work.segments if work.segments is not None else (text,)
            self._call(segments)
            self._pending = list(segments)
            work.progress("queued")
        expected = self._pending.pop(0)
        if expected != text:
            raise SynthesisFailed("The render session got segments out of order")
        while True:
            try:
                item = await self._next()
                self._route(False)  # a replica took it (or it ended)
            except _ReplicaLost as lost:
                # Nothing of this call has been sent on: it can start over on another replica
                # (Serve routes around a dead one, or waits for its replacement).
                if self._started or self._retries >= RETRIES:
                    raise EngineLost(f"The engine replica stopped: {lost}") from None
                self._retries += 1
                log.warning("engine replica lost before it answered (%s); trying again", lost)
                self._call(self._segments)
                continue
            if isinstance(item, Update):
                self._started = self._started or item.progress == "running"
                work.progress(item.progress)
            elif isinstance(item, Failure):
                raise item.error
            elif isinstance(item, Segment):
                self._answered = True
                rendered = Rendered(item.chunks(), item.words)
                if not self._pending:  # the call's last segment: read it to its end
                    await self._finish_stream()
                return rendered
            else:
                raise SynthesisFailed("The engine replica ended the session early")

    async def _next(self) -> Update | Segment | Failure | None:
        limit = self._renderer.timeout + GRACE_SECONDS
        try:
            with self._mapped():
                async with asyncio.timeout(limit):
                    item: Update | Segment | Failure = await anext(self._stream)
                    return item
        except StopAsyncIteration:
            self._ended = True
            return None
        except TimeoutError:
            raise RequestTimeout(f"No engine replica answered for {limit:g} s") from None

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        """Serve's and Ray's errors as VoxMux's (a lost replica as `_ReplicaLost`)."""
        try:
            yield
        except BackPressureError:
            raise Overloaded(
                f"Every engine replica for '{self._work.model_id}' is at capacity and the queue "
                "in front of them is full; retry later",
                retry_after=self._renderer.retry_after(),
            ) from None
        except RayActorError as exc:
            raise _ReplicaLost(str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                               ) from exc
        except RayError as exc:
            raise SynthesisFailed(f"The engine replica failed: {exc}") from exc

    async def _finish_stream(self) -> None:
        """Read a finished call to its end (streamed text makes one per sentence). Every
        segment has arrived: a replica lost now loses nothing."""
        while self._stream is not None and not self._ended:
            try:
                item = await self._next()
            except _ReplicaLost:
                self._ended = True
                return
            if isinstance(item, Failure):
                raise item.error

    async def idle(self) -> None:
        """Nothing to let go here: the replica holds a place and the model per call, and a
        streamed text's sentences are calls of their own."""

    def close(self) -> None:
        """Cancel a call that still has segments to send (the job ended early); one that sent
        them all has been read to its end, and one that never ran (refused, failed) has nothing
        to cancel and its error has been raised already."""
        self._route(False)
        if self._stream is not None and not self._ended:
            self._ended = True
            with contextlib.suppress(Exception):
                self._stream.cancel()
