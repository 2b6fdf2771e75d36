"""Wyoming's budgets, tried from a client's side as a careless or hostile client would: one
address opening more connections than it may, the server full, a client that asks for a long
text and reads nothing, clients gone at any moment, events poured in faster than they can be
read. Each refusal is one `error` event naming the limit and its setting, whatever a connection
held (its place, its speech job) is given back when it ends, and the event loop keeps running."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe

from app.protocols.wyoming import Places
from tests.conftest import LiveServer, free_port, start_server, test_settings

pytestmark = pytest.mark.skipif(sys.platform != "linux",
                                reason="other loopback addresses and TCP_INFO are Linux's")

PER_CLIENT, IN_ALL = 3, 8
SEND_TIMEOUT = 1.0
LONG_TEXT = " ".join(["The long report goes on and on about the weather in the hills."] * 60)
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    port = free_port()
    live = start_server(test_settings(tmp_path_factory.mktemp("wyoming-limits"), preload=[],
                                      idle_ttl=-1, cache_max_items=0, wyoming_port=port,
                                      wyoming_max_connections=IN_ALL,
                                      wyoming_max_connections_per_client=PER_CLIENT,
                                      wyoming_send_timeout=SEND_TIMEOUT,
                                      ws_first_message_timeout=2))
    yield live, port
    live.stop()


async def _connect(port: int, source: str = "127.0.0.1", receive_buffer: int = 0) -> Connection:
    """A connection from `source` (any 127.x address is this machine's); a small
    `receive_buffer` makes a client that reads nothing stall the server sooner."""
    sock = socket.socket()
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.bind((source, 0))
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


async def _ask(connection: Connection, event: Event, until: str) -> list[Event]:
    """Send `event`; the events answered up to `until`, an error, or the end."""
    reader, writer = connection
    await async_write_event(event, writer)
    events: list[Event] = []
    while (answer := await asyncio.wait_for(async_read_event(reader), 30)) is not None:
        events.append(answer)
        if answer.type in (until, "error"):
            break
    return events


async def _served(connection: Connection) -> bool:
    """Whether the server answers `describe` (False: it refused the connection)."""
    events = await _ask(connection, Describe().event(), "info")
    return [e.type for e in events] == ["info"]


async def _refusal(port: int, source: str = "127.0.0.1") -> tuple[list[Event], float]:
    """What a client asking `describe` gets up to the end of the connection, and how long the
    server took to close it."""
    started = time.monotonic()
    reader, writer = connection = await _connect(port, source)
    events = await _ask(connection, Describe().event(), "info")
    while (event := await asyncio.wait_for(async_read_event(reader), 10)) is not None:
        events.append(event)
    writer.close()
    return events, time.monotonic() - started


async def _served_again(port: int, source: str = "127.0.0.1", within: float = 5) -> None:
    """A fresh connection from `source` is served once a place was freed (the server frees it
    as soon as it sees the connection end)."""
    deadline = time.monotonic() + within
    while True:
        connection = await _connect(port, source)
        served = await _served(connection)
        connection[1].close()
        if served:
            return
        assert time.monotonic() < deadline, "the place was never freed"
        await asyncio.sleep(0.1)


async def _all_free(port: int, within: float = 10) -> None:
    """Every place of the server is free: as many connections as it allows are all served."""
    deadline = time.monotonic() + within
    while True:
        held = [await _connect(port, f"127.0.7.{i}") for i in range(IN_ALL)]
        served = [await _served(c) for c in held]
        for connection in held:
            connection[1].close()
        if all(served):
            return
        assert time.monotonic() < deadline, f"{served.count(False)} places never freed"
        await asyncio.sleep(0.2)


def _names(text: str, setting: str) -> bool:
    return re.search(rf"\b{setting}\b", text) is not None


def _refused_for(events: list[Event], setting: str) -> Error:
    assert [e.type for e in events] == ["error"], events
    error = Error.from_event(events[0])
    assert error.code == "too_many_connections", error
    assert _names(error.text or "", setting), error.text
    return error


def test_one_address_over_its_cap_is_refused_and_others_still_connect(
        limited: tuple[LiveServer, int]) -> None:
    port = limited[1]

    async def attempt() -> None:
        held = [await _connect(port) for _ in range(PER_CLIENT)]
        assert all([await _served(c) for c in held])  # each holds its place
        events, seconds = await _refusal(port)
        _refused_for(events, "VOXMUX_WYOMING_MAX_CONNECTIONS_PER_CLIENT")
        assert seconds < 2, seconds  # closed at once, not at a timeout
        other = await _connect(port, "127.0.0.2")
        assert await _served(other)  # another address still connects
        other[1].close()
        held.pop()[1].close()
        await _served_again(port)  # the closed connection's place is free
        for connection in held:
            connection[1].close()

    asyncio.run(attempt())


def test_a_full_server_refuses_every_address(limited: tuple[LiveServer, int]) -> None:
    port = limited[1]

    async def attempt() -> None:
        held = [await _connect(port, f"127.0.2.{i // PER_CLIENT}") for i in range(IN_ALL)]
        assert all([await _served(c) for c in held])
        events, seconds = await _refusal(port, "127.0.0.3")
        _refused_for(events, "VOXMUX_WYOMING_MAX_CONNECTIONS")
        assert seconds < 2, seconds
        held.pop()[1].close()
        await _served_again(port, "127.0.0.3")
        for connection in held:
            connection[1].close()

    asyncio.run(attempt())


def test_every_way_a_connection_ends_frees_its_place(limited: tuple[LiveServer, int]) -> None:
    """Gone mid-request, closed after a request, silent past the first-event timeout, a bad
    event, refused: once they have ended, every place is free again."""
    port = limited[1]

    async def attempt() -> None:
        gone = await _connect(port)
        await async_write_event(Event("synthesize", {"text": LONG_TEXT,
                                                     "voice": {"name": "espeak:en-us"}}), gone[1])
        await asyncio.wait_for(async_read_event(gone[0]), 30)  # audio-start: it is speaking
        silent = await _connect(port)
        described = await _connect(port)
        assert await _served(described)
        _refused_for((await _refusal(port))[0], "VOXMUX_WYOMING_MAX_CONNECTIONS_PER_CLIENT")
        gone[1].transport.abort()
        described[1].close()
        bad = await _connect(port)
        bad[1].write(b"not an event\n")
        for reader, _ in (bad, silent):  # both closed by the server
            while await asyncio.wait_for(async_read_event(reader), 10) is not None:
                pass
        await _all_free(port)  # a place any of them kept would leave one short

    asyncio.run(attempt())


def _open(sock: socket.socket) -> bool:
    """Whether the server still has the connection open (TCP_ESTABLISHED), read without
    reading the socket: a read would let the server go on sending."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 1


def _request_ids(live: LiveServer) -> set[str]:
    with httpx.Client(base_url=live.url) as http:
        return {r["id"] for r in http.get("/requests").json()["data"]}


def _ended_and_idle(live: LiveServer, before: set[str], within: float) -> dict[str, object]:
    """The one request made since `before` once it has ended; the model's engine idle."""
    deadline = time.monotonic() + within
    with httpx.Client(base_url=live.url) as http:
        while True:
            mine = [r for r in http.get("/requests").json()["data"] if r["id"] not in before]
            assert len(mine) <= 1, mine
            espeak = http.get("/stats").json()["models"]["espeak"]
            if mine and mine[0]["status"] not in ("queued", "loading", "running", "streaming") \
                    and espeak["refcount"] == 0 and espeak["running"] == 0:
                return dict(mine[0])
            assert time.monotonic() < deadline, (mine[:1], espeak)
            time.sleep(0.2)


@pytest.mark.parametrize("streamed", [False, True], ids=["synthesize", "synthesize-start"])
def test_a_client_that_reads_nothing_is_cut_off_and_its_request_cancelled(
        limited: tuple[LiveServer, int], streamed: bool) -> None:
    """Minutes of speech asked for, nothing read: the server gives up on the connection
    `VOXMUX_WYOMING_SEND_TIMEOUT` (1 s here) after its writes stopped moving, cancels the
    request (the engine stops, its lease is returned) and serves the next client."""
    live, port = limited
    voice = {"name": "espeak:en-us"}
    before = _request_ids(live)

    async def attempt() -> float:
        _, writer = await _connect(port, receive_buffer=4096)
        events = ([Event("synthesize-start", {"voice": voice}),
                   Event("synthesize-chunk", {"text": LONG_TEXT}), Event("synthesize-stop")]
                  if streamed else [Event("synthesize", {"text": LONG_TEXT, "voice": voice})])
        for event in events:
            await async_write_event(event, writer)
        started, sock = time.monotonic(), writer.get_extra_info("socket")
        while _open(sock) and time.monotonic() - started < 20:
            await asyncio.sleep(0.1)
        seconds = time.monotonic() - started
        writer.transport.abort()
        return seconds

    seconds = asyncio.run(attempt())
    assert seconds < 10, f"still open after {seconds:.0f} s"
    record = _ended_and_idle(live, before, within=10)
    assert record["status"] == "cancelled", record

    async def next_client() -> list[Event]:
        connection = await _connect(port)
        return await _ask(connection, Event("synthesize", {"text": "Hello there.",
                                                            "voice": voice}), "audio-stop")

    assert asyncio.run(next_client())[-1].type == "audio-stop"
    asyncio.run(_all_free(port))


@pytest.mark.parametrize("delay", [0, 0.01, 0.1, 0.4])
def test_a_client_gone_at_any_moment_leaves_nothing_behind(limited: tuple[LiveServer, int],
                                                           delay: float) -> None:
    """Gone (a reset) right after asking, while the request is planned, queued or speaking, in
    both forms: no request keeps running, the engine is idle, the places are free."""
    live, port = limited
    voice = {"name": "espeak:en-us"}
    asks = [[Event("synthesize", {"text": LONG_TEXT, "voice": voice})],
            [Event("synthesize-start", {"voice": voice}),
             Event("synthesize-chunk", {"text": LONG_TEXT})],
            [Event("synthesize-start", {"voice": voice}),
             Event("synthesize-chunk", {"text": LONG_TEXT}), Event("synthesize-stop")]]

    async def attempt() -> None:
        connections = [await _connect(port, f"127.0.6.{i}") for i in range(len(asks))]
        for (_, writer), events in zip(connections, asks, strict=True):
            for event in events:
                await async_write_event(event, writer)
        await asyncio.sleep(delay)
        for _, writer in connections:
            writer.transport.abort()

    asyncio.run(attempt())
    deadline = time.monotonic() + 10
    with httpx.Client(base_url=live.url) as http:
        while True:
            running = [r for r in http.get("/requests").json()["data"]
                       if r["status"] in ("queued", "loading", "running", "streaming")]
            espeak = http.get("/stats").json()["models"]["espeak"]
            if not running and espeak["refcount"] == 0 and espeak["running"] == 0:
                break
            assert time.monotonic() < deadline, (running, espeak)
            time.sleep(0.1)
    asyncio.run(_all_free(port))


def test_places_count_in_all_and_per_client() -> None:
    places = Places(limit=3, per_client=2)
    assert places.take("a") is None and places.take("a") is None
    refused = places.take("a")
    assert refused is not None
    assert _names(refused.message, "VOXMUX_WYOMING_MAX_CONNECTIONS_PER_CLIENT")
    assert places.take("b") is None
    full = places.take("c")
    assert full is not None and _names(full.message, "VOXMUX_WYOMING_MAX_CONNECTIONS")
    places.free("a")
    assert places.take("c") is None and places.open == 3
    for client in ("a", "b", "c"):
        places.free(client)
    assert places.open == 0 and places.take("a") is None


def test_an_event_flood_leaves_the_server_responsive(limited: tuple[LiveServer, int]) -> None:
    """Events poured in as fast as sockets take them, from every place the server has: the
    server's event loop still runs every few milliseconds (20 ms at worst here; it stood still
    for 1.1 to 1.3 s while the handler went through all that was buffered before handing it
    back), and each flooder is served afterwards. The lag is timed on the server's own loop: a
    client in this process would wait for the interpreter lock as much as for the loop."""
    live, port = limited
    flood = b"".join(json.dumps({"type": kind}).encode() + b"\n"
                     for kind in ["ping-me", "audio-chunk", "audio-stop"] * 1000)
    flooding = threading.Event()

    async def lag() -> float:
        worst = 0.0
        while flooding.is_set():
            started = time.monotonic()
            await asyncio.sleep(0.005)
            worst = max(worst, time.monotonic() - started - 0.005)
        return worst

    async def attempt() -> None:
        connections = [await _connect(port, f"127.0.1.{i}") for i in range(IN_ALL)]
        assert all([await _served(c) for c in connections])

        async def pour(connection: Connection) -> bool:
            for _ in range(10):
                connection[1].write(flood)
                await connection[1].drain()
            return await _served(connection)  # answered once every event before it was read

        assert all(await asyncio.gather(*(pour(c) for c in connections)))
        for _, writer in connections:
            writer.close()

    flooding.set()
    probe = asyncio.run_coroutine_threadsafe(lag(), live.server.servers[0].get_loop())
    try:
        asyncio.run(attempt())
    finally:
        flooding.clear()
    worst = probe.result(timeout=10)
    assert worst < 0.25, f"the server's loop stood still for {worst:.2f} s"


def test_describe_is_answered_a_few_times_a_connection(limited: tuple[LiveServer, int]) -> None:
    """Each `info` answer is 27 KB: 3,000 `describe` lines (60 KB) were answered with 83 MB.
    Past `MAX_DESCRIBES` the connection gets an error and is closed."""
    from app.protocols.wyoming import MAX_DESCRIBES

    async def attempt() -> list[str]:
        reader, writer = await _connect(limited[1], "127.0.9.1")
        writer.write((json.dumps({"type": "describe"}) + "\n").encode() * 50)
        await writer.drain()
        kinds = []
        while (event := await asyncio.wait_for(async_read_event(reader), 10)) is not None:
            kinds.append(event.type)
        writer.close()
        return kinds

    kinds = asyncio.run(attempt())
    assert kinds == ["info"] * MAX_DESCRIBES + ["error"], kinds
