"""Storms and stalls over HTTP: many clients hanging up at once, clients that leave while
queued or never read, and idle unloads racing a burst of requests.

Afterwards nothing may be left behind: no slot, queue place, lease or open stream, and the server
answers the next request with good audio.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.reliability.checks import IDLE, WAITING, hang_up, idle_state, lanes, wait_until

CLIENTS = 20


def story(tag: str, sentences: int = 12) -> str:
    """A long text, unique per call (the cache is on), many segments."""
    return " ".join(
        f"Part {i} of the story {tag} tells how the river bends around the old mill."
        for i in range(sentences)
    )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = test_settings(
        tmp_path_factory.mktemp("storm"), preload=["piper", "espeak"], concurrency=1,
        queue_size=64, model_ttl={"piper": 0, "espeak": 0},
    )
    server = start_server(settings)
    yield server
    server.stop()


def send_raw(url: str, body: dict[str, Any], request_id: str = "") -> socket.socket:
    """A speech request on a bare socket, so the test decides exactly what is read and when."""
    data = json.dumps(body).encode()
    host, port = url.removeprefix("http://").rsplit(":", 1)
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n")
    if request_id:
        head += f"X-Request-ID: {request_id}\r\n"
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall((head + "\r\n").encode() + data)
    return sock


def drop_after_first_bytes(url: str, model: str, tag: str) -> int:
    """Stream a long text, hang up as soon as audio arrives; return the bytes seen."""
    body = {"model": model, "input": story(tag), "response_format": "pcm"}
    with httpx.Client(base_url=url, timeout=60) as client, client.stream(
        "POST", "/v1/audio/speech", json=body
    ) as response:
        assert response.status_code == 200
        return len(next(response.iter_raw()))


def drop_without_reading(url: str, model: str, tag: str, after: float) -> None:
    """Send the request, read nothing, hang up `after` seconds later."""
    sock = send_raw(url, {"model": model, "input": story(tag), "response_format": "mp3"})
    time.sleep(after)
    hang_up(sock)


def loads(live: LiveServer, model: str) -> float:
    """How many times `model` has been loaded, from the Prometheus histogram's count."""
    metrics = httpx.get(live.url + "/metrics", timeout=30).text
    prefix = f'voxmux_engine_load_seconds_count{{model="{model}"}} '
    counts = [line.removeprefix(prefix) for line in metrics.splitlines() if line.startswith(prefix)]
    return float(counts[0]) if counts else 0.0


def speak(url: str, model: str, text: str) -> tuple[int, bytes, str]:
    with httpx.Client(base_url=url, timeout=120) as client:
        response = client.post("/v1/audio/speech", json={
            "model": model, "input": text, "response_format": "wav"})
    return response.status_code, response.content, response.text if response.is_error else ""


def test_disconnect_storm_leaves_nothing_behind(live: LiveServer) -> None:
    tag = uuid.uuid4().hex[:8]
    with ThreadPoolExecutor(CLIENTS) as pool:
        readers = [pool.submit(drop_after_first_bytes, live.url, model, f"{tag}r{i}")
                   for i, model in enumerate(["piper", "espeak"] * (CLIENTS // 4))]
        silent = [pool.submit(drop_without_reading, live.url, model, f"{tag}s{i}", 0.05 * i)
                  for i, model in enumerate(["piper", "espeak"] * (CLIENTS // 4))]
        assert all(f.result() > 0 for f in readers)
        for f in silent:
            f.result()

    assert wait_until(lambda: idle_state(live), IDLE, timeout=30) == IDLE
    with live.client() as client:
        stats = client.get("/stats").json()
        assert stats["active"] == 0 and stats["queued"] == 0
        assert all(m["refcount"] == 0 for m in stats["models"].values())
        storm = client.get("/requests").json()["data"][:CLIENTS]  # newest first
    # A silent client's request may have finished before it hung up; none failed or lingers.
    assert {r["status"] for r in storm} <= {"cancelled", "done"}, [r["status"] for r in storm]
    assert sum(r["status"] == "cancelled" for r in storm) >= CLIENTS // 2

    status, audio, error = speak(live.url, "piper", f"Still here after the storm {tag}.")
    assert status == 200, error
    assert decode(audio, "wav").duration > 0.5


def test_a_client_that_leaves_while_queued_gives_up_its_place_at_once(live: LiveServer) -> None:
    """No engine time is spent on a request whose client is already gone."""
    tag = uuid.uuid4().hex[:8]
    holder_done = threading.Event()

    def hold_the_slot() -> None:
        body = {"model": "piper", "input": story(f"{tag}h", 40), "response_format": "pcm"}
        with httpx.Client(base_url=live.url, timeout=60) as client, client.stream(
            "POST", "/v1/audio/speech", json=body
        ) as response:
            chunks = response.iter_raw()
            next(chunks)
            holder_done.wait(30)  # keeps reading nothing; synthesis goes on in the background

    holder = threading.Thread(target=hold_the_slot)
    holder.start()
    try:
        assert wait_until(lambda: lanes(live).running, 1) == 1
        sockets = [
            send_raw(live.url, {"model": "piper", "input": f"Queued request {i} {tag}.",
                                "response_format": "wav"}, request_id=f"queued-{i}-{tag}")
            for i in range(5)
        ]
        assert wait_until(lambda: lanes(live).queued, 5) == 5
        for sock in sockets:
            hang_up(sock)
        # The places are given up while the holder still synthesizes, not when its turn comes.
        assert wait_until(lambda: lanes(live).queued, 0, timeout=5) == 0
        assert lanes(live).running == 1
    finally:
        holder_done.set()
        holder.join(30)
    assert wait_until(lambda: idle_state(live), IDLE, timeout=30) == IDLE
    with live.client() as client:
        rows = {r["id"]: r for r in client.get("/requests").json()["data"]}
    queued = [rows[f"queued-{i}-{tag}"] for i in range(5)]
    assert all(r["status"] == "cancelled" and r["segments_done"] == 0 for r in queued), queued


def test_a_reader_that_never_reads_holds_no_slot_or_lease(live: LiveServer) -> None:
    """While the client reads nothing, synthesis runs ahead of it by the stream buffer, then
    waits holding no place and no lease; all of the audio arrives once the client reads."""
    host, port = live.url.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.sock = sock
    request_id = f"stalled-{uuid.uuid4().hex[:8]}"
    body = {"model": "espeak", "input": story(uuid.uuid4().hex[:8], 50), "response_format": "pcm"}
    conn.request("POST", "/v1/audio/speech", body=json.dumps(body),
                 headers={"content-type": "application/json", "x-request-id": request_id})
    time.sleep(0.5)
    try:
        assert wait_until(lambda: idle_state(live), WAITING) == WAITING  # nothing read yet
    except AssertionError:
        conn.close()
        raise
    response = conn.getresponse()
    audio = response.read()
    conn.close()
    assert response.status == 200, audio[:300]
    with live.client() as client:
        row = {r["id"]: r for r in client.get("/requests").json()["data"]}[request_id]
    received_ms = len(audio) / 2 / int(response.getheader("x-sample-rate", "0")) * 1000
    assert row["status"] == "done"
    assert received_ms == pytest.approx(row["audio_duration_ms"], abs=1)
    assert received_ms > 60_000


def test_idle_unload_racing_a_burst_of_requests(live: LiveServer) -> None:
    """TTL 0: each model unloads the moment it is idle, while new requests keep arriving."""
    tag = uuid.uuid4().hex[:8]
    jobs: list[tuple[str, str]] = [
        (model, f"Burst {i} {tag} says hello.") for i, model in
        enumerate(["piper", "espeak"] * 12)
    ]
    loads_before = {model: loads(live, model) for model in ("piper", "espeak")}
    results: list[tuple[int, bytes, str]] = []
    with ThreadPoolExecutor(8) as pool:
        for round_start in range(0, len(jobs), 8):  # waves: each lets the models go idle
            wave = jobs[round_start:round_start + 8]
            results += list(pool.map(lambda job: speak(live.url, *job), wave))
            time.sleep(0.02 * (round_start // 8))
    for (model, _), (status, audio, error) in zip(jobs, results, strict=True):
        assert status == 200, error
        assert "not loaded" not in error
        clip = decode(audio, "wav")
        assert clip.duration > 0.4 and clip.rms > 0.01, model
    assert wait_until(lambda: idle_state(live), IDLE) == IDLE
    # The race really ran: each model was unloaded and loaded again during the burst.
    assert all(loads(live, model) > loads_before[model] + 1 for model in loads_before)

    def statuses() -> dict[str, str]:
        states = live.app.state.service.registry.status()
        return {model: states[model].status.value for model in loads_before}

    unloaded = {"piper": "unloaded", "espeak": "unloaded"}
    assert wait_until(statuses, unloaded) == unloaded
