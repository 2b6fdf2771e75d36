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
          ) -> list[tuple[str, str, bool]]:
    """(event, ticket, background) for every turn asked for and granted on eSpeak's lane."""
    lane = espeak_server.app.state.service.registry["espeak"].lane
    log: list[tuple[str, str, bool]] = []
    original = lane.turn

    @asynccontextmanager
    async def recorded(ticket: str, timeout: float | None, client: str = "",
                       background: bool = False) -> AsyncIterator[Any]:
        log.append(("ask", ticket, background))
        async with original(ticket, timeout, client, background) as turn:
            log.append(("grant", ticket, background))
            yield turn

    monkeypatch.setattr(lane, "turn", recorded)
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

    interactive = {ticket for _, ticket, background in turns if not background}
    assert len(interactive) >= 6
    waiting: set[str] = set()
    checked = 0
    for event, ticket, background in turns:
        if background:
            if event == "grant":
                assert not waiting, f"a job segment went before waiting requests {waiting}"
            continue
        if event == "ask":
            waiting.add(ticket)
        else:
            waiting.discard(ticket)
            checked += 1
    assert checked >= 6
    # and the job did run between them: its turns are interleaved with theirs
    kinds = [background for event, _, background in turns if event == "grant"]
    first_interactive = kinds.index(False)
    assert any(kinds[first_interactive:]) and any(kinds[:first_interactive])
