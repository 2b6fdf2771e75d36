"""Job segments yield the engine to interactive requests on the same model.

A book renders on eSpeak NG (one engine call at a time, the default) while interactive requests
arrive; every engine turn the lane hands out is recorded. Once an interactive request asks for a
turn, no job segment is granted one before it: the request waits for the job's segment under way
at most. The measured effect on first audio is in `bench/results/jobs_fair.md`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.app.jobs.conftest import wait_job
from tests.conftest import LiveServer


@pytest.fixture
def turns(espeak_server: LiveServer, monkeypatch: pytest.MonkeyPatch
          ) -> list[tuple[str, bool]]:
    """("ask" or "grant", background) for every turn on eSpeak's lane, in the order the lane
    decided them: a grant is logged when the lane hands the turn out (it notes the client it
    serves), not when the waiting coroutine next runs."""
    lane = espeak_server.app.state.service.registry["espeak"].lane
    log: list[tuple[str, bool]] = []
    original_turn, original_serve = lane.turn, lane._round.serve

    @asynccontextmanager
    async def asked(ticket: str, timeout: float | None, client: str = "",
                    background: bool = False) -> AsyncIterator[Any]:
        log.append(("ask", background))
        async with original_turn(ticket, timeout, client, background) as turn:
            yield turn

    def served(client: str) -> None:
        log.append(("grant", client.startswith("job:")))
        original_serve(client)

    monkeypatch.setattr(lane, "turn", asked)
    monkeypatch.setattr(lane._round, "serve", served)
    return log


def test_an_interactive_request_waits_for_one_job_segment_at_most(
        espeak_server: LiveServer, turns: list[tuple[str, str, bool]]) -> None:
    with espeak_server.client() as client:
        job = client.post("/v1/audio/jobs", json={
            "model": "espeak", "voice": "en-us", "response_format": "wav",
            "items": [{"input": f"Part {n} of a long book, read slowly and with care, "
                       "one sentence after another." * 3} for n in range(150)]}).json()
        wait_job(client, job["id"], until=("running",))
        while client.get(f"/v1/audio/jobs/{job['id']}").json()["progress"]["done"] < 5:
            time.sleep(0.01)

        def speak(n: int) -> None:
            with espeak_server.client() as own:
                response = own.post("/v1/audio/speech", json={
                    "model": "espeak", "input": f"Interactive request {n}. " * 8,
                    "response_format": "pcm"})
                assert response.status_code == 200

        threads = [threading.Thread(target=speak, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
            time.sleep(0.05)
        for thread in threads:
            thread.join(60)
        assert wait_job(client, job["id"], timeout=120)["status"] == "done"

    waiting = 0
    granted = 0
    for event, background in turns:
        if not background and event == "ask":
            waiting += 1
        elif not background:
            waiting -= 1
            granted += 1
        elif event == "grant":
            assert waiting == 0, "a job segment was given the engine while a request waited"
    assert granted >= 6
    # and the job did run between them: its turns are interleaved with theirs
    kinds = [background for event, background in turns if event == "grant"]
    first_interactive = kinds.index(False)
    assert any(kinds[first_interactive:]) and any(kinds[:first_interactive])
