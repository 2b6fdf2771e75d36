"""The job runner: creates jobs, renders them segment by segment through the speech service, and
brings them back after a restart.

Each item is planned when the job is made, as any request is (`SpeechService.plan(long=True)`:
SSML compiled, the creator's lexicons applied, budgets checked), and what planning made is stored
with it (`CutRecord`: its segments, what each is read with, the text SSML and lexicons made). It
renders as one `SpeechJob` of the service's planned from that record (`replan`), never prepared
again, so a resumed item starts at its first segment without a stored file and joins it to the
one before exactly as an uninterrupted run would (the pause before a segment is part of that
segment's stored audio). Job segments take background turns on their model's lane: an
interactive request waits at most for the segment under way.

A finished segment is stored (`JobStore.finish_segment`) before the next is counted: a kill -9
loses at most the segment being rendered. At start, jobs the last process left queued or running
are queued again, oldest first. A model that is busy (429) or slow to give a turn (504) only
delays a job: it retries from where it stopped. Other failures fail the job (a book) or the item
(a batch, whose other items go on); a full store fails the job, never the server.

A shared store (Redis: `VOXMUX_JOBS_STORE`, the default on a Ray cluster with Redis) is read and
written by several processes (ingress replicas): a job is run by whichever claims its lease,
renewed every second; any process answers for it, a cancel anywhere marks it and its runner
stops within a second, and when a process dies its jobs go to another once their leases lapse,
resuming at the first segment without stored audio. A chapter's missing segments may render as
parts at once (`_windows`): on a cluster, Serve spreads them over the engine replicas.

A job's audio is bounded (`jobs_max_audio_seconds`): the segment that would take the audio stored
past it fails the job (`over_budget`), a batch's too. Every store call runs in a thread, never on
the event loop; a job's ZIP is built by one caller at a time (`result_zip`), the others waiting
on the loop, not in a thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.audio.encoders import to_pcm16
from app.http.errors import error_body
from app.jobs.book import too_long
from app.jobs.model import (
    BOOK_FORMAT,
    DiskFull,
    Item,
    Job,
    JobKind,
    Progress,
    Segment,
    StoreUnavailable,
)
from app.jobs.results import job_book, job_zip
from app.jobs.store import JobStore, Store, WordRow
from app.serving.budgets import OverBudget, check_audio, env_name, seconds
from app.serving.events import SegmentEnd, SegmentWords
from app.serving.plan import CutRecord, SpeechPlan
from app.serving.service import SpeechService
from app.settings import Settings
from engines.base import Cancelled, EngineLost, Overloaded, RequestTimeout, VoxMuxError

if TYPE_CHECKING:
    from app.jobs.redis_store import RedisJobStore

log = logging.getLogger(__name__)

RETRY_SECONDS = (1, 2, 5, 10, 30)
"""Waits before a job retries a model that was busy, longest last (then kept)."""
OPEN_RETRY_SECONDS = 2.0
"""How often a shared store that could not be opened (Redis not up yet) is tried again."""
KEEP_SECONDS = 1.0
"""How often a process renews its leases and looks for jobs, cancels and progress made by
other processes (shared store)."""
LOST_RETRY_SECONDS = 1.0
"""Wait before a part whose engine replica was lost goes on (Serve notices the loss)."""


@dataclass
class _Run:
    """What the runner knows of a job it is rendering now."""

    task: asyncio.Task[None] | None = None
    started: float = field(default_factory=time.monotonic)
    chars_done: int = 0
    """Characters rendered in this run (for the estimate)."""
    chars_left: int = 0
    cancelling: bool = False
    seconds: float = 0.0
    """Audio stored for the job so far (its earlier runs' included), against its budget."""


class JobOverBudget(OverBudget):
    """The job's audio would pass `jobs_max_audio_seconds`: the whole job fails (a batch's
    too, unlike a budget of one of its items)."""


@dataclass
class _ZipTurn:
    """One job's ZIP lock, kept while anyone holds or waits for it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class JobRunner:
    def __init__(self, service: SpeechService, settings: Settings, on_done: Any = None) -> None:
        self.service = service
        self.store: Store
        """Opened by `start` (building an app writes nothing to its data dir)."""
        self.settings = settings
        self.on_done = on_done
        """Called (in a thread) with the store and each job that finished well: the outputs
        directory."""
        self._books = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="voxmux-book")
        """Audiobooks are encoded here, one at a time: an hour of AAC takes a minute of a core,
        and a few at once in the shared pool starved every other route's thread."""
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self.shared = False
        """Whether the store is shared with other processes (Redis, on a cluster): then jobs are
        claimed from it under a lease, not queued here."""
        self.worker = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()
        self._claiming: set[str] = set()
        self._runs: dict[str, _Run] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._zips: dict[str, _ZipTurn] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.unavailable: str | None = None
        """Why the store could not be opened, if it could not."""

    def available(self) -> JobRunner:
        """Itself, once its store is open; else `StoreUnavailable` (503)."""
        if self.unavailable is not None or not hasattr(self, "store"):
            raise StoreUnavailable(self.unavailable or "The job store is not open yet")
        return self

    # -- lifetime ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the store, queue the jobs the last process left, start the workers. A store
        that cannot be opened (a read-only data dir) leaves the server serving everything but
        jobs, which answer 503 (`available`)."""
        settings = self.settings
        # On a cluster with Redis, every ingress replica sees every job (app.jobs.redis_store).
        self.shared = settings.jobs_store == "redis" or (
            settings.jobs_store == "auto" and bool(settings.cache_url)
            and self.service.fleet is not None)
        if (self.service.fleet is not None and not self.shared
                and settings.ray_ingress_replicas > 1):
            # Each replica would keep its own SQLite file (or share one on a volume and both
            # requeue the same interrupted jobs): jobs would be lost from one answer to the next.
            self.unavailable = (
                f"Jobs need a store every ingress replica shares, and "
                f"{settings.ray_ingress_replicas} ingress replicas run "
                "(VOXMUX_RAY_INGRESS_REPLICAS): set VOXMUX_CACHE_URL to a Redis "
                "(VOXMUX_JOBS_STORE=auto or redis), or run one ingress replica")
            log.error("jobs: %s", self.unavailable)
            return
        if not await self._try_open():
            if self.shared:  # a Redis that starts after VoxMux (compose, Kubernetes): wait
                self._tasks = [asyncio.create_task(self._open_later(), name="jobs-open")]
            return
        await self._start_workers()

    async def _try_open(self) -> bool:
        try:
            self.store = await asyncio.to_thread(self._open)
        except (OSError, sqlite3.Error, StoreUnavailable) as exc:
            self.unavailable = (
                f"The shared job store cannot be opened ({exc}); check VOXMUX_CACHE_URL"
                if self.shared else
                f"The job store in {self.settings.data_dir} cannot be opened ({exc}); "
                "set VOXMUX_DATA_DIR to a writable directory")
            log.error("jobs: %s", self.unavailable)
            return False
        self.unavailable = None
        return True

    async def _open_later(self) -> None:
        """Try the shared store again every few seconds until it opens, then run jobs."""
        while not await self._try_open():
            await asyncio.sleep(OPEN_RETRY_SECONDS)
        log.info("jobs: the shared job store is open")
        await self._start_workers()

    async def _start_workers(self) -> None:
        if not self.shared:  # (a shared store's jobs are claimed as their leases lapse)
            for job_id in await asyncio.to_thread(self._requeue):
                self._queue.put_nowait(job_id)
                log.info("job %s: resumed after a restart", job_id)
        self._tasks += [asyncio.create_task(self._worker(), name=f"jobs-{n}")
                        for n in range(self.settings.jobs_concurrency)]
        self._tasks.append(asyncio.create_task(self._sweep(), name="jobs-retention"))

    def _requeue(self) -> list[str]:
        """The jobs the last process left queued or running, queued again."""
        interrupted = self.store.interrupted()
        for job_id in interrupted:
            self.store.set_status(job_id, "queued")
        return interrupted

    def _open(self) -> Store:
        settings = self.settings
        if self.shared:
            from app.jobs.redis_store import RedisJobStore  # (the redis client: the ray extra)

            if not settings.cache_url:
                raise StoreUnavailable("VOXMUX_JOBS_STORE=redis needs VOXMUX_CACHE_URL "
                                       "(redis://...)")
            return RedisJobStore(settings.cache_url, settings.data_dir, settings.jobs_max_bytes)
        return JobStore(settings.data_dir, settings.jobs_max_bytes)

    def _leases(self) -> RedisJobStore:
        """The shared store, whose jobs are run under leases."""
        from app.jobs.redis_store import RedisJobStore

        assert isinstance(self.store, RedisJobStore)
        return self.store

    async def stop(self) -> None:
        """At shutdown: running jobs stop where they are and stay `running` in the store, so the
        next start resumes them (a shared store's, another process as soon as it looks)."""
        for task in self._tasks:
            task.cancel()
        runs = {job_id: r.task for job_id, r in self._runs.items() if r.task is not None}
        for task in runs.values():
            task.cancel()
        await asyncio.gather(*self._tasks, *runs.values(), return_exceptions=True)
        self._books.shutdown(wait=False, cancel_futures=True)
        if hasattr(self, "store"):
            if self.shared:
                for job_id in runs:
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(self._leases().release, job_id, self.worker)
            await asyncio.to_thread(self.store.close)

    # -- making ------------------------------------------------------------------------------

    async def create(self, owner: str, kind: JobKind, request: dict[str, Any],
                     items: list[Item], client: str = "", files: dict[str, bytes] | None = None
                     ) -> Job:
        """Plan every item as any request is planned (`SpeechService.plan(long=True)`: SSML
        compiled, the lexicons of `client`, the job's creator, applied, budgets checked), store
        the job with the cut planning made, once, and queue it. A batch's item that cannot be
        planned carries its error and the others go on; a book's fails the job. `files` are
        kept in the job's folder (an EPUB's cover), counted against the store's bound."""
        check_chars(items, self.settings)
        plans: dict[int, SpeechPlan] = {}
        for item in items:
            if item.error is not None:
                continue
            try:
                plans[item.index] = await self.service.plan(
                    **item.options.plan_fields(), text=item.text,
                    input_format=item.options.input_format, client=client, long=True)
            except VoxMuxError as exc:
                if kind != "batch":
                    raise
                item.error = error_body(exc)["error"]
        check_audio(sum(plan.least_seconds for plan in plans.values()),
                    self.settings.jobs_max_audio_seconds, "jobs_max_audio_seconds", "The job")
        job = await asyncio.to_thread(self._store_new, owner, kind, request, items, plans,
                                      files or {})
        if self.shared:
            self._wake.set()  # a free worker here claims it now (or one elsewhere, later)
        else:
            self._queue.put_nowait(job.id)
        return job

    def _store_new(self, owner: str, kind: JobKind, request: dict[str, Any], items: list[Item],
                   plans: dict[int, SpeechPlan], files: dict[str, bytes]) -> Job:
        now = time.time()
        job = Job(id="job_" + uuid.uuid4().hex, owner=owner, kind=kind, status="queued",
                  created=now, updated=now, request=request)
        segments: list[Segment] = []
        for item in items:
            plan = plans.get(item.index)
            if item.error is not None or plan is None:
                continue
            record = CutRecord.of(plan)
            item.sample_rate, item.reading = plan.sample_rate, record.reading
            first = len(segments)
            segments += [Segment(first + n, item.index, n, text, offset, how=how)
                         for n, (text, offset, how) in enumerate(zip(
                             record.segments, record.offsets, record.hows, strict=True))]
        self.store.create(job, items, segments)
        for name, data in files.items():  # before it is queued: nothing reads them yet
            try:
                self.store.reserve(len(data))
            except DiskFull:
                log.warning("job %s: no room for its %s; left out", job.id, name)
                continue
            path = self.store.file(job.id, name)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            except BaseException:
                self.store.unreserve(len(data))
                path.unlink(missing_ok=True)
                raise
            self.store.add_file(job.id, name, len(data))
        return job

    # -- reading -----------------------------------------------------------------------------

    def progress(self, job: Job, counts: tuple[int, int, float]) -> Progress:
        """The job's progress from its store `counts`, with an estimate of the time left."""
        done, total, stored = counts
        eta: float | None = 0.0 if job.ended else None
        run = self._runs.get(job.id)
        if run is not None and run.chars_done:
            rate = (time.monotonic() - run.started) / run.chars_done
            eta = rate * run.chars_left
        return Progress(done, total, stored, eta)

    async def changed(self, job_id: str, timeout: float) -> None:
        """Return when the job's state or progress changes, or after `timeout` seconds."""
        event = self._changed.setdefault(job_id, asyncio.Event())
        if self.shared and job_id not in self._runs:  # another process may be running it
            timeout = min(timeout, KEEP_SECONDS)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()

    def _notify(self, job_id: str) -> None:
        event = self._changed.pop(job_id, None)
        if event is not None:
            event.set()

    # -- cancelling --------------------------------------------------------------------------

    async def cancel(self, job: Job) -> None:
        """Stop a queued or running job; its finished segments stay readable. A job another
        process runs (shared store) is marked `cancelled`; that process stops it within
        `KEEP_SECONDS`."""
        if job.ended:
            return
        run = self._runs.get(job.id)
        if run is not None and run.task is not None:
            run.cancelling = True
            run.task.cancel()
        else:
            await asyncio.to_thread(self.store.set_status, job.id, "cancelled")
        self._notify(job.id)

    async def delete(self, job: Job) -> None:
        """Stop the job and delete it with its files; a segment being stored meanwhile gives
        its own bytes back (`Store.finish_segment`)."""
        run = self._runs.get(job.id)
        if run is not None and run.task is not None:
            run.cancelling = True
            run.task.cancel()
            await asyncio.gather(run.task, return_exceptions=True)
        await asyncio.to_thread(self.store.delete, job.id)
        self._notify(job.id)

    # -- results -----------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def zip_turn(self, job_id: str) -> AsyncIterator[None]:
        """The job's turn to build its ZIP: one build per job at a time (a client's GET and the
        outputs copy may ask at once), waited for on the loop, never holding a thread; other
        jobs' ZIPs are built meanwhile."""
        turn = self._zips.setdefault(job_id, _ZipTurn())
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if not turn.users:
                del self._zips[job_id]

    async def result_zip(self, job: Job) -> Path:
        """The finished job's ZIP (`app.jobs.results.job_zip`), built in its turn."""
        async with self.zip_turn(job.id):
            return await asyncio.to_thread(job_zip, self.store, job)

    async def result_book(self, job: Job) -> Path:
        """The finished book job's audiobook (`app.jobs.results.job_book`), in the same turn."""
        async with self.zip_turn(job.id):
            return await asyncio.get_running_loop().run_in_executor(
                self._books, job_book, self.store, job, self.settings.chapter_pause_ms)

    # -- running -----------------------------------------------------------------------------

    async def _next(self) -> str:
        """The next job to run: from this process's queue, or claimed from a shared store."""
        if not self.shared:
            return await self._queue.get()
        store = self._leases()
        while True:
            try:
                for job_id in await asyncio.to_thread(store.claimable):
                    if job_id in self._runs or job_id in self._claiming:
                        continue  # another worker of this process has it (one lease each)
                    self._claiming.add(job_id)
                    try:
                        if await asyncio.to_thread(store.claim, job_id, self.worker,
                                                   self.settings.jobs_lease_seconds):
                            self._runs[job_id] = _Run()  # before any other worker looks
                            return job_id
                    finally:
                        self._claiming.discard(job_id)
            except StoreUnavailable as exc:  # Redis away: look again, as long as it takes
                log.warning("jobs: %s", exc.message)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(KEEP_SECONDS):
                    await self._wake.wait()

    async def _keep(self, job_id: str, run: _Run) -> None:
        """While a shared store's job runs here: renew its lease, and stop it when another
        process cancelled or deleted it (`cancelled` in the store) or took it over."""
        store, lease = self._leases(), self.settings.jobs_lease_seconds
        while True:
            await asyncio.sleep(KEEP_SECONDS)
            try:
                held = await asyncio.to_thread(store.renew, job_id, self.worker, lease)
                job = await asyncio.to_thread(store.job, job_id)
            except StoreUnavailable as exc:  # Redis away: keep rendering, try again
                log.warning("job %s: %s", job_id, exc.message)
                continue
            if job is None or job.status == "cancelled" or not held:
                if job is None or job.status == "cancelled":
                    run.cancelling = True
                else:
                    log.warning("job %s: its lease went to another process", job_id)
                if run.task is not None:
                    run.task.cancel()
                return

    async def _worker(self) -> None:
        while True:
            job_id = await self._next()
            run = self._runs.setdefault(job_id, _Run())
            try:
                job = await asyncio.to_thread(self.store.job, job_id)
            except StoreUnavailable as exc:
                log.warning("job %s: %s", job_id, exc.message)
                job = None
            if job is None or job.ended:
                self._runs.pop(job_id, None)
                if self.shared:
                    with contextlib.suppress(StoreUnavailable):
                        await asyncio.to_thread(self._leases().release, job_id, self.worker)
                continue
            run.task = asyncio.create_task(self._run(job), name=f"job-{job_id}")
            keeper = asyncio.create_task(self._keep(job_id, run)) if self.shared else None
            try:
                await asyncio.shield(run.task)
            except asyncio.CancelledError:
                if not run.task.done():  # the worker itself is stopping
                    run.task.cancel()
                    await asyncio.gather(run.task, return_exceptions=True)
                    raise
                if run.cancelling:  # cancelled before it first ran
                    await asyncio.to_thread(self.store.set_status, job_id, "cancelled")
            except Exception:  # the store failed under the job: the next job still runs
                log.exception("job %s: the runner failed", job_id)
            finally:
                self._runs.pop(job_id, None)
                if keeper is not None:
                    keeper.cancel()
                    with contextlib.suppress(Exception):
                        await asyncio.to_thread(self._leases().release, job_id, self.worker)
                self._notify(job_id)

    async def _run(self, job: Job) -> None:
        run = self._runs[job.id]
        store = self.store
        await asyncio.to_thread(store.set_status, job.id, "running")
        self._notify(job.id)
        try:
            items, segments, counts = await asyncio.to_thread(
                lambda: (store.items(job.id), store.segments(job.id), store.counts(job.id)))
            run.chars_left = sum(len(s.text) for s in segments if s.samples is None)
            run.seconds = counts[2]
            for item in items:
                if item.error is None:
                    await self._item(job, item, run)
        except asyncio.CancelledError:
            if run.cancelling:
                await asyncio.to_thread(self._cancelled, job.id)
                return
            raise  # the server is stopping: the job stays `running`, to resume
        except StoreUnavailable as exc:  # (shared) it resumes here or elsewhere, lease lapsed
            log.warning("job %s stopped: %s", job.id, exc.message)
            return
        except Exception as exc:
            await asyncio.to_thread(store.set_status, job.id, "failed", error_body(exc)["error"])
            if not isinstance(exc, VoxMuxError):
                log.exception("job %s failed", job.id)
            else:
                log.warning("job %s failed: %s", job.id, exc.message)
            return
        finished = await asyncio.to_thread(self._done, job.id)
        if finished is not None and self.on_done is not None:
            # A batch's copy in the outputs directory is its ZIP, an audiobook's its .m4b: each
            # built in the job's ZIP turn.
            kept_whole = job.kind == "batch" or job.request.get("response_format") == BOOK_FORMAT
            turn: contextlib.AbstractAsyncContextManager[Any] = (
                self.zip_turn(job.id) if kept_whole else contextlib.nullcontext())
            async with turn:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.on_done, store, finished)

    def _cancelled(self, job_id: str) -> None:
        """Mark a job cancelled here as such, unless it was deleted."""
        if self.store.job(job_id) is not None:
            self.store.set_status(job_id, "cancelled")

    def _done(self, job_id: str) -> Job | None:
        """Mark the job done, unless it was cancelled (by another process, just now) or
        deleted meanwhile; the job as it now is."""
        current = self.store.job(job_id)
        if current is None or current.status == "cancelled":
            return None
        self.store.set_status(job_id, "done")
        return self.store.job(job_id)

    async def _item(self, job: Job, item: Item, run: _Run) -> None:
        """Render what is left of one item, in parts at once (`_windows`)."""
        segments = await asyncio.to_thread(self.store.segments, job.id, item.index)
        windows = _windows(segments, await self._at_once())
        try:
            await _all(self._part(job, item, start, end, run) for start, end in windows)
        except (DiskFull, Cancelled, JobOverBudget):
            raise
        except VoxMuxError as exc:
            if job.kind != "batch":
                raise
            await asyncio.to_thread(self.store.set_item, job.id, item.index,
                                    error=error_body(exc)["error"])

    async def _part(self, job: Job, item: Item, start: int, end: int, run: _Run) -> None:
        """Render segments `start` to `end` of the item, retrying from where it stopped when the
        model was busy (429: a full lane, or a full Serve queue) or slow to give a turn (504);
        each part on its own, so parts waiting for room do not cancel the one rendering."""
        tries = 0
        lost_at: int | None = None
        """The segment that was rendering when an engine replica was last lost."""
        while True:
            segments = await asyncio.to_thread(self.store.segments, job.id, item.index)
            first = next((s.part for s in segments[start:end] if s.samples is None), None)
            if first is None:
                return
            # Up to the next stored segment: a finished segment is never rendered again.
            stop = next((s.part for s in segments[first:end] if s.samples is not None), end)
            try:
                await self._render(job, item, segments, first, stop, run)
                tries = 0
            except (Overloaded, RequestTimeout) as exc:
                wait = RETRY_SECONDS[min(tries, len(RETRY_SECONDS) - 1)]
                log.info("job %s: %s; retrying in %d s", job.id, exc.message, wait)
                tries += 1
                await asyncio.sleep(wait)
            except EngineLost as exc:
                # A node that went, a replica killed: the part goes on from its first segment
                # not stored, on another replica. A segment that was rendering at two losses
                # is taken for their cause (an input that kills its engine) and fails the job.
                segments = await asyncio.to_thread(self.store.segments, job.id, item.index)
                rendering = next((s.part for s in segments[first:stop] if s.samples is None),
                                 None)
                if rendering is None or rendering == lost_at:
                    raise
                lost_at = rendering
                log.warning("job %s: %s; rendering from segment %d again", job.id, exc.message,
                            rendering + 1)
                await asyncio.sleep(LOST_RETRY_SECONDS)

    async def _at_once(self) -> int:
        """Parts of an item rendered at once: `jobs_parallel`, or by default one in a single
        process and one per engine replica running now on a cluster (Serve routes each part
        to a replica with room)."""
        if self.settings.jobs_parallel:
            return self.settings.jobs_parallel
        fleet = self.service.fleet
        return 1 if fleet is None else max(1, len(await fleet.replicas()))

    async def _render(self, job: Job, item: Item, segments: list[Segment], start: int,
                      end: int, run: _Run) -> None:
        """Segments `start` to `end` of the item, planned from the cut the job stored (`replan`),
        ending at `end` (the pause before a segment is its own, so a part joins as the whole
        would)."""
        part = f"-{start}" if end < len(segments) or start else ""
        record = CutRecord(tuple(s.text for s in segments), tuple(s.offset for s in segments),
                           tuple(s.how for s in segments), item.reading)
        plan = await asyncio.to_thread(functools.partial(
            self.service.replan, **item.options.plan_fields(), text=item.text, record=record,
            end=end, start=start, request_id=f"{job.id}-{item.index + 1:03d}{part}",
            client=f"job:{job.owner}"))
        rate = plan.sample_rate
        clock = 0
        chunks: list[np.ndarray] = []
        words: list[WordRow] = []
        async with self.service.speak(plan) as speech:
            async for event in speech.events():
                if isinstance(event, SegmentWords):
                    words = [(w.word, w.start - clock / rate, w.end - clock / rate,
                              w.char_start, w.char_end) for w in event.words]
                elif isinstance(event, SegmentEnd):
                    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
                    segment = segments[event.index]
                    await self._store_segment(job, segment, audio, rate, words, run)
                    clock += event.samples
                    chunks, words = [], []
                    run.chars_done += len(segment.text)
                    run.chars_left -= len(segment.text)
                    self._notify(job.id)
                else:
                    chunks.append(event)

    async def _store_segment(self, job: Job, segment: Segment, audio: np.ndarray, rate: int,
                             words: list[WordRow], run: _Run) -> None:
        """Store a rendered segment, counted against the job's audio budget first: the segment
        that would pass it is not stored, and fails the job (`JobOverBudget`)."""
        added = len(audio) / rate
        limit = self.settings.jobs_max_audio_seconds
        if run.seconds + added > limit:
            raise JobOverBudget(
                "The job's audio", f"over {seconds(limit)}", seconds(limit),
                env_name("jobs_max_audio_seconds"),
                hint="split the text into several jobs, or raise the budget")
        run.seconds += added  # (before the await: parts storing at once see each other)
        store = self.store
        try:
            await asyncio.to_thread(lambda: store.finish_segment(job.id, segment.seq,
                                                                 to_pcm16(audio), words))
        except BaseException:
            run.seconds -= added
            raise

    async def _sweep(self) -> None:
        """Delete finished jobs past their retention, at start and then hourly."""
        hours = self.settings.jobs_retention_hours
        while True:
            try:
                if hours > 0:
                    expired = await asyncio.to_thread(self.store.expired,
                                                      time.time() - hours * 3600)
                    for job_id in expired:
                        await asyncio.to_thread(self.store.delete, job_id)
                        log.info("job %s: deleted after %g h (VOXMUX_JOBS_RETENTION_HOURS)",
                                 job_id, hours)
                await asyncio.to_thread(self.store.prune)
            except StoreUnavailable as exc:
                log.warning("jobs: retention skipped: %s", exc.message)
            await asyncio.sleep(min(3600.0, max(60.0, hours * 3600)))


def check_chars(items: list[Item], settings: Settings) -> None:
    """A job's text within `jobs_max_chars`, before anything is planned (as every other
    reading of a job's text counts it: `app.jobs.book.too_long`)."""
    chars = sum(len(i.text) for i in items)
    if chars > settings.jobs_max_chars:
        raise too_long(settings.jobs_max_chars, chars)


def _windows(segments: list[Segment], at_once: int) -> list[tuple[int, int]]:
    """The item's segments still to render, as (start, end) parts: one part from the first
    missing to the end when one at a time; else each run of missing segments cut into about
    `at_once` parts of equal length."""
    missing = [s.part for s in segments if s.samples is None]
    if not missing:
        return []
    if at_once <= 1:
        return [(missing[0], len(segments))]
    size = -(-len(missing) // at_once)
    runs: list[tuple[int, int]] = []
    for part in missing:
        if runs and runs[-1][1] == part and runs[-1][1] - runs[-1][0] < size:
            runs[-1] = (runs[-1][0], part + 1)
        else:
            runs.append((part, part + 1))
    return runs


async def _all(renders: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run the parts together; the first failure cancels the others and is raised as it is."""
    tasks = [asyncio.ensure_future(render) for render in renders]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
