"""Lanes: admission with 429 over the queue and over a client's share, turns segment by segment
in arrival order within a client and round the clients, turn timeouts, a turn held until its
engine call returns, and nobody idle holding an engine."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from app.main import create_app
from app.serving.scheduler import Lane, LaneState
from engines.base import CancelToken, Overloaded, RequestTimeout
from tests.conftest import LiveServer, decode, start_server, test_settings


@asynccontextmanager
async def admitted(lane: Lane, ticket: str, client: str = "") -> AsyncIterator[None]:
    """What a render session does: admission (or a 429), then a place while it renders."""
    lane.admit(client)
    async with lane.place(ticket, client):
        yield


WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "grove", "harbor", "indigo",
         "juniper"]


async def test_turns_go_to_waiters_in_arrival_order() -> None:
    lane = Lane("m", concurrency=1, queue_size=8)
    order: list[int] = []
    release = asyncio.Event()

    async def job(n: int) -> None:
        async with admitted(lane, f"t{n}"), lane.turn(f"t{n}", None):
            order.append(n)
            await release.wait()

    first = asyncio.create_task(job(0))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(job(n)) for n in range(1, 6)]
    await asyncio.sleep(0)
    assert lane.state().running == 1 and lane.state().queued == 5
    assert [lane.position(f"t{n}") for n in range(1, 6)] == [1, 2, 3, 4, 5]
    release.set()
    await asyncio.gather(first, *waiters)
    assert order == [0, 1, 2, 3, 4, 5]
    assert lane.state() == LaneState(0, 0, 0)
    lane.close()


async def test_requests_take_turns_segment_by_segment() -> None:
    """A request arriving while another is being synthesized gets the next turn: its first
    audio waits for one segment, not for the whole of the earlier request."""
    lane = Lane("m", concurrency=1, queue_size=8)
    order: list[str] = []

    async def request(name: str, segments: int) -> None:
        async with admitted(lane, name):
            for index in range(segments):
                async with lane.turn(name, None) as turn:
                    await turn.call(lambda: time.sleep(0.02), CancelToken(), None)
                    order.append(f"{name}{index}")

    first = asyncio.create_task(request("a", 3))
    await asyncio.sleep(0.005)  # a's first segment is running
    await asyncio.gather(first, request("b", 3))
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]
    lane.close()


async def test_turns_go_round_the_clients() -> None:
    """One client with many requests waiting cannot delay another client's first turn by more
    than the call that is running: turns alternate between clients, and within a client they
    keep arrival order."""
    lane = Lane("m", concurrency=1, queue_size=16)
    order: list[str] = []

    async def request(client: str, name: str, segments: int) -> None:
        async with admitted(lane, name, client):
            for index in range(segments):
                async with lane.turn(name, None, client) as turn:
                    await turn.call(lambda: time.sleep(0.01), CancelToken(), None)
                    order.append(f"{name}{index}")

    flood = [asyncio.create_task(request("a", f"a{n}", 2)) for n in range(4)]
    await asyncio.sleep(0.003)  # a0's first segment runs, a1..a3 wait
    await asyncio.gather(*flood, request("b", "b", 2))
    assert order.index("b0") == 1, order  # right after the call that was running
    assert order.index("b1") < order.index("a30"), order
    own = [name for name in order if name.startswith("a")]
    assert [n for n in own if n.endswith("0")] == ["a00", "a10", "a20", "a30"]
    lane.close()


async def test_one_client_cannot_take_every_place() -> None:
    lane = Lane("m", concurrency=1, queue_size=3, client_places=2)
    async with admitted(lane, "a1", "a"), admitted(lane, "a2", "a"):
        with pytest.raises(Overloaded, match="This client already has 2 requests"):
            lane.admit("a")
        async with admitted(lane, "b1", "b"), admitted(lane, "b2", "b"):  # another client's share
            with pytest.raises(Overloaded, match="at capacity"):
                lane.admit("c")
    assert lane.state() == LaneState(0, 0, 0)
    lane.close()


async def test_a_request_under_way_waits_for_a_place_beyond_its_share() -> None:
    """Sessions admitted while they held nothing (idle text sockets) cannot take more than their
    client's share once they all speak: the ones over it wait, holding nothing, and get a place
    in turn; another client still finds room."""
    lane = Lane("m", concurrency=1, queue_size=5, client_places=2)
    for _ in range(4):
        lane.admit("a")  # four sessions opened, none holding anything yet
    release = asyncio.Event()
    order: list[str] = []

    async def speak(ticket: str) -> None:
        async with lane.place(ticket, "a", timeout=5):
            order.append(ticket)
            await release.wait()

    tasks = [asyncio.create_task(speak(f"a{n}")) for n in range(4)]
    await asyncio.sleep(0.01)
    assert order == ["a0", "a1"] and lane.state().queued == 2  # a2, a3 wait for a place
    lane.admit("b")  # the other client's share is whole
    async with lane.place("b0", "b"):
        pass
    with pytest.raises(RequestTimeout, match=r"waited 0\.05 s for a place"):
        async with lane.place("a9", "a", timeout=0.05):
            pass
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["a0", "a1", "a2", "a3"] and lane.state() == LaneState(0, 0, 0)
    lane.close()


async def test_over_capacity_is_refused_with_retry_after() -> None:
    lane, other = Lane("m", concurrency=1, queue_size=1), Lane("o", concurrency=1, queue_size=1)
    hold = asyncio.Event()

    async def job(n: int) -> None:
        async with admitted(lane, f"t{n}"), lane.turn(f"t{n}", None):
            await hold.wait()

    tasks = [asyncio.create_task(job(n)) for n in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Overloaded) as refused:
        async with admitted(lane, "t9"):
            pass
    assert refused.value.retry_after >= 1
    async with admitted(other, "t9"):  # lanes are per model
        pass
    hold.set()
    await asyncio.gather(*tasks)
    assert lane.state() == LaneState(0, 0, 0)


async def test_cancelled_and_timed_out_waiters_leave_the_queue() -> None:
    lane = Lane("m", concurrency=1, queue_size=4)
    hold = asyncio.Event()

    async def holder() -> None:
        async with lane.turn("h", None):
            await hold.wait()

    async def waiter(ticket: str, timeout: float | None = None) -> str:
        async with admitted(lane, ticket), lane.turn(ticket, timeout):
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
    assert lane.position("c") == 1
    hold.set()
    assert await last == "c"
    await running
    assert lane.state() == LaneState(0, 0, 0)


async def test_a_turn_granted_to_a_cancelled_waiter_passes_on() -> None:
    lane = Lane("m", concurrency=1, queue_size=4)
    hold = asyncio.Event()

    async def holder() -> None:
        async with lane.turn("h", None):
            await hold.wait()

    async def waiter(ticket: str) -> str:
        async with lane.turn(ticket, None):
            return ticket

    running = asyncio.create_task(holder())
    await asyncio.sleep(0)
    doomed = asyncio.create_task(waiter("a"))
    heir = asyncio.create_task(waiter("b"))
    await asyncio.sleep(0)
    hold.set()
    await asyncio.sleep(0)  # the holder leaves and grants "a" its turn ...
    doomed.cancel()  # ... which is cancelled before it could run
    assert await heir == "b"
    await asyncio.gather(running, doomed, return_exceptions=True)
    assert lane.state() == LaneState(0, 0, 0)


async def test_a_cancelled_call_holds_its_turn_until_the_engine_returns() -> None:
    """Cancelling a request stops its engine call through the token; an engine that ignores
    the token keeps the turn until it returns, so no second call ever overlaps it."""
    lane = Lane("m", concurrency=1, queue_size=4)
    stuck, token = threading.Event(), CancelToken()
    abandoned: list[BaseException] = []

    async def first() -> None:
        async with lane.turn("a", None) as turn:
            await turn.call(lambda: stuck.wait(5), token, None, abandoned.append)

    async def second() -> int:
        async with lane.turn("b", None) as turn:
            return await turn.call(lambda: lane.in_flight, CancelToken(), None)

    running = asyncio.create_task(first())
    await asyncio.sleep(0.05)
    assert lane.in_flight == 1
    after = asyncio.create_task(second())
    running.cancel()
    await asyncio.sleep(0.1)
    assert token.cancelled and not running.done() and not after.done()
    assert lane.in_flight == 1  # the engine call still runs and still holds the only turn
    stuck.set()
    assert await after == 1  # only itself in flight when it ran
    with pytest.raises(asyncio.CancelledError):
        await running
    assert [type(e) for e in abandoned] == [asyncio.CancelledError]
    assert lane.state() == LaneState(0, 0, 0)
    lane.close()


async def test_a_call_past_its_timeout_is_reported_at_once_and_released_when_it_stops() -> None:
    lane = Lane("m", concurrency=1, queue_size=4)
    token = CancelToken()
    abandoned: list[BaseException] = []
    started = time.monotonic()

    async def call() -> None:
        async with lane.turn("a", None) as turn:
            await turn.call(lambda: token.wait(5), token, 0.1, abandoned.append)

    with pytest.raises(RequestTimeout):
        await call()
    # The engine honoured the token: the timeout was told at once and the thread stopped.
    assert [type(e) for e in abandoned] == [RequestTimeout]
    assert time.monotonic() - started < 2 and lane.state() == LaneState(0, 0, 0)
    lane.close()


async def test_an_unread_stream_waits_holding_nothing(tmp_path: Path) -> None:
    """A reader that stops reading: synthesis runs ahead of it by the stream buffer, then waits
    holding no place and no lease; once the reader is back, every segment arrives."""
    app = create_app(test_settings(tmp_path, preload=[], stream_buffer_seconds=4))
    service = app.state.service
    text = " ".join(f"Sentence {word} is spoken while nobody reads it." for word in WORDS)
    plan = await service.plan(model="espeak", text=text)
    lane = service.registry["espeak"].lane
    try:
        async with service.speak(plan) as job:
            assert job.record is not None
            waiting = 0
            for _ in range(600):
                idle = (job.record.segments_done > 0 and lane.state() == LaneState(0, 0, 0)
                        and service.registry.status()["espeak"].refcount == 0)
                waiting = waiting + 1 if idle else 0
                if waiting == 10:  # half a second with nothing held and nothing made
                    break
                await asyncio.sleep(0.05)
            assert waiting == 10, (job.record.status, lane.state())
            ahead = job.record.segments_done
            assert job.record.status == "streaming" and ahead < len(plan.segments)
            samples = sum([len(chunk) async for chunk in job.audio()])
        assert job.stats is not None and job.stats.outcome == "done"
        assert job.record.segments_done == len(plan.segments) > ahead
        assert samples > 22050 * 10
        assert abs(samples / 22.05 - job.stats.audio_duration_ms) < 0.1
    finally:
        service.close()
        await service.registry.close()


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = test_settings(tmp_path_factory.mktemp("sched"), preload=["piper"],
                             concurrency=1, queue_size=2, client_max_requests=3)
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
    lane = small_server.app.state.service.registry["piper"].lane
    assert lane.state() == LaneState(0, 0, 0)
    with small_server.client() as http:
        stats = http.get("/stats").json()
    assert stats["active"] == 0 and stats["queued"] == 0
    assert stats["requests"]["rejected"] == statuses.count(429)


def test_a_client_that_hangs_up_frees_the_slot(small_server: LiveServer) -> None:
    lane = small_server.app.state.service.registry["piper"].lane
    text = " ".join(f"Paragraph {word} goes on and on about the weather in the hills."
                    for word in WORDS * 3)
    with small_server.client() as http, http.stream("POST", "/v1/audio/speech", json={
        "model": "piper", "input": text, "response_format": "pcm",
        "stream_format": "audio"}) as response:
        assert response.status_code == 200 and response.headers["x-voxmux-cache"] == "miss"
        request_id = response.headers["x-request-id"]
        chunks = response.iter_bytes()
        next(chunks)
        assert lane.state().running == 1
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
    assert lane.state() == LaneState(0, 0, 0)


async def test_a_background_waiter_cancelled_as_the_turn_passes_leaves_cleanly() -> None:
    """A job part cancelled while it waits (a cancelled job with parts at once): the turn that
    ends at that moment skips it; its own clean-up finds it gone and ends as a plain cancel
    (a ValueError from the queue replaced the cancel before)."""
    lane = Lane("m", concurrency=1, queue_size=8)

    async def background(ticket: str) -> None:
        async with lane.turn(ticket, None, background=True):
            await asyncio.sleep(0)

    async with lane.turn("interactive", None):
        first = asyncio.create_task(background("first"))
        second = asyncio.create_task(background("second"))
        await asyncio.sleep(0.01)  # both wait
        first.cancel()  # its future is cancelled now; its task runs its clean-up later
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError), results
    assert results[1] is None
