"""An SSML voice switch is still one request to its client: what would end it at the switch is
its error before the first byte (a clean status), never a 200 cut short. A model it switches to
that cannot load is a 503; one that takes no new request from the client is a 429."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import LiveServer
from tests.reliability.faulty import MODEL, Faults, start_with_faulty

SWITCH = f'<speak>Hello there. <voice name="{MODEL}">A tone.</voice> Goodbye.</speak>'


@pytest.fixture(scope="module")
def faults() -> Faults:
    return Faults(slow_seconds=2.0)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, faults: Faults) -> Iterator[LiveServer]:
    """One request at a time on each model (no queue), so a running one fills a model."""
    server = start_with_faulty(tmp_path_factory.mktemp("switch"), faults, preload=["espeak"],
                               concurrency=1, queue_size=0, idle_ttl=-1)
    yield server
    faults.release.set()
    server.stop()


def _speak(live: LiveServer, text: str, model: str = "espeak") -> httpx.Response:
    with live.client() as client:
        return client.post("/v1/audio/speech", json={
            "model": model, "input": text, "response_format": "wav"})


def test_a_model_that_cannot_load_is_a_503_before_any_audio(live: LiveServer,
                                                            faults: Faults) -> None:
    faults.load_error = "no weights here"
    try:
        for _ in range(2):  # the first load fails, and the model in error after it
            response = _speak(live, SWITCH)
            assert response.status_code == 503, response.status_code
            assert response.json()["error"]["code"] == "model_load_failed"
    finally:
        faults.load_error = None
    response = _speak(live, SWITCH)  # it loads now: the switch is tried again
    assert response.status_code == 200, response.text
    assert int(response.headers["x-voxmux-segments"]) == 3


def test_a_model_that_takes_no_new_request_is_a_429_before_any_audio(live: LiveServer) -> None:
    holding = threading.Thread(target=_speak, args=(live, "SLOW.", MODEL))
    holding.start()
    try:
        deadline = time.monotonic() + 10
        with live.client() as client:  # until the slow request holds the faulty model's place
            while client.get("/stats").json()["models"][MODEL]["running"] == 0:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        response = _speak(live, SWITCH)
        assert response.status_code == 429, response.status_code
        assert response.json()["error"]["code"] == "queue_full"
        assert "retry-after" in response.headers
    finally:
        holding.join()
    assert _speak(live, SWITCH).status_code == 200
