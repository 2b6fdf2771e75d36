"""Admission: FIFO slots, 429 over the queue, queue timeouts, and nobody idle holding an engine."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.main import create_app
from app.serving.scheduler import Scheduler
from engines.base import Overloaded, RequestTimeout
from tests.conftest import LiveServer, decode, start_server, test_settings

WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "grove", "harbor", "indigo",
         "juniper"]


async def test_slots_go_to_waiters_in_arrival_order() -> None:
    scheduler = Scheduler(concurrency=1, queue_size=8)
    order: list[int] = []
    release = asyncio.Event()

    async def job(n: int) -> None:
        async with scheduler.slot("m", f"t{n}"):
            order.append(n)
            await release.wait()

    first = asyncio.create_task(job(0))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(job(n)) for n in range(1, 6)]
    await asyncio.sleep(0)
    assert scheduler.active == 1 and scheduler.queued == 5
    assert [scheduler.position("m", f"t{n}") for n in range(1, 6)] == [1, 2, 3, 4, 5]
    release.set()
    await asyncio.gather(first, *waiters)
    assert order == [0, 1, 2, 3, 4, 5]
    assert scheduler.active == scheduler.queued == 0


async def test_over_the_queue_is_refused_with_retry_after() -> None:
    scheduler = Scheduler(concurrency=1, queue_size=1)
    hold = asyncio.Event()

    async def job() -> None:
        async with scheduler.slot("m"):
            await hold.wait()

    tasks = [asyncio.create_task(job()) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as refused:
        async with scheduler.slot("m"):
            pass
    assert refused.value.retry_after >= 1
    async with scheduler.slot("other"):  # lanes are per model
        pass
    hold.set()
    await asyncio.gather(*tasks)
    assert scheduler.active == 0


async def test_cancelled_and_timed_out_waiters_leave_the_queue() -> None:
    scheduler = Scheduler(concurrency=1, queue_size=4)
    hold = asyncio.Event()

    async def holder() -> None:
        async with scheduler.slot("m"):
            await hold.wait()

    async def waiter(ticket: str, timeout: float | None = None) -> str:
        async with scheduler.slot("m", ticket, timeout=timeout):
            return ticket

    running = asyncio.create_task(holder())
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(waiter("a"))
    last = asyncio.create_task(waiter("c"))
    await asyncio.sleep(0)
    with pytest.raises(RequestTimeout):
        await waiter("b", timeout=0.05)
    cancelled.cancel()
    await asyncio.sleep(0)
    assert scheduler.position("m", "c") == 1
    hold.set()
    assert await last == "c"
    await running
    assert scheduler.active == scheduler.queued == 0


async def test_a_slot_granted_to_a_cancelled_waiter_passes_on() -> None:
    scheduler = Scheduler(concurrency=1, queue_size=4)
    hold = asyncio.Event()

    async def holder() -> None:
        async with scheduler.slot("m"):
            await hold.wait()

    async def waiter(ticket: str) -> str:
        async with scheduler.slot("m", ticket):
            return ticket

    running = asyncio.create_task(holder())
    await asyncio.sleep(0)
    doomed = asyncio.create_task(waiter("a"))
    heir = asyncio.create_task(waiter("b"))
    await asyncio.sleep(0)
    hold.set()
    await asyncio.sleep(0)  # the holder leaves and grants "a" its slot ...
    doomed.cancel()  # ... which is cancelled before it could run
    assert await heir == "b"
    await asyncio.gather(running, doomed, return_exceptions=True)
    assert scheduler.active == scheduler.queued == 0


async def test_an_unread_stream_frees_its_slot_and_lease(tmp_path: Path) -> None:
    """Synthesis never waits for the reader: a stalled client holds no engine."""
    app = create_app(test_settings(tmp_path, preload=[]))
    service = app.state.service
    text = " ".join(f"Sentence {word} is spoken while nobody reads it." for word in WORDS)
    job = service.plan(model="espeak", text=text)
    stream = service.run(job)
    try:
        for _ in range(600):
            if job.record.status == "done":
                break
            await asyncio.sleep(0.05)
        assert job.record.status == "done"
        assert service.scheduler.active == 0
        assert service.registry.status()["espeak"].refcount == 0
        samples = sum([len(chunk) async for chunk in stream])
        assert samples == job.stats.samples > 22050 * 10
    finally:
        await stream.aclose()
        await service.registry.close()


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = test_settings(tmp_path_factory.mktemp("sched"), preload=["piper"],
                             concurrency=1, queue_size=2)
    live = start_server(settings)
    yield live
    live.stop()


async def _poll_queue(url: str, until: asyncio.Event) -> set[int | None]:
    positions: set[int | None] = set()
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        while not until.is_set():
            rows = (await http.get("/requests")).json()["data"]
            positions |= {r["queue_position"] for r in rows if r["status"] == "queued"}
            await asyncio.sleep(0.02)
    return positions


async def test_overload_refuses_extras_and_serves_the_admitted(small_server: LiveServer) -> None:
    tag = uuid.uuid4().hex[:4]
    texts = [f"Request {word} {tag}: the kettle sings while rain taps on the window. "
             "Somewhere down the hall a radio plays an old song about the sea. "
             "Nobody listens, but nobody turns it off either." for word in WORDS[:8]]
    finished = asyncio.Event()

    async def speak(http: httpx.AsyncClient, text: str) -> httpx.Response:
        return await http.post("/v1/audio/speech", json={
            "model": "piper", "input": text, "response_format": "wav"})

    async with httpx.AsyncClient(base_url=small_server.url, timeout=120) as http:
        poller = asyncio.create_task(_poll_queue(small_server.url, finished))
        responses = await asyncio.wait_for(
            asyncio.gather(*(speak(http, t) for t in texts)), timeout=240
        )
        finished.set()
        positions = await poller

    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1 and statuses.count(200) >= 3, statuses
    for response in responses:
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            error = response.json()["error"]
            assert error["code"] == "queue_full" and error["type"] == "rate_limit_error"
        else:
            audio = decode(response.content, "wav")
            assert audio.sample_rate == 22050 and 5 < audio.duration < 25 and audio.rms > 0.01
    # None: a request between its arrival and its first step through admission.
    assert positions - {None} <= {1, 2} and 1 in positions, positions
    service = small_server.app.state.service
    assert service.scheduler.active == 0 and service.scheduler.queued == 0
    with small_server.client() as http:
        stats = http.get("/stats").json()
    assert stats["active"] == 0 and stats["queued"] == 0
    assert stats["requests"]["rejected"] == statuses.count(429)


def test_a_client_that_hangs_up_frees_the_slot(small_server: LiveServer) -> None:
    service = small_server.app.state.service
    text = " ".join(f"Paragraph {word} goes on and on about the weather in the hills."
                    for word in WORDS * 3)
    with small_server.client() as http, http.stream("POST", "/v1/audio/speech", json={
        "model": "piper", "input": text, "response_format": "pcm",
        "stream_format": "audio"}) as response:
        assert response.status_code == 200 and response.headers["x-voxmux-cache"] == "miss"
        request_id = response.headers["x-request-id"]
        chunks = response.iter_bytes()
        next(chunks)
        assert service.scheduler.active == 1
    # Closed after the first chunk: the rest of the synthesis must stop, not run to the end.
    with small_server.client() as http:
        for _ in range(600):
            rows = {r["id"]: r for r in http.get("/requests").json()["data"]}
            if rows[request_id]["status"] == "cancelled":
                break
            time.sleep(0.05)
    row = rows[request_id]
    assert row["status"] == "cancelled", row
    assert row["segments_done"] < row["segments"]
    assert service.scheduler.active == 0
