"""A job whose engine is lost mid-segment (on a cluster: its engine replica killed, its node
gone; `EngineLost`, injected here by the `faulty` engine) goes on from its first segment not
stored, on whatever serves next, and finishes; a segment that was rendering at two losses is
taken for their cause and fails the job, so an input that kills its engine kills one more at
most. (Each loss failed the job: a long job was lost with its node.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.app.jobs.conftest import wait_job
from tests.conftest import LiveServer, decode
from tests.reliability.faulty import MODEL, SECONDS_PER_CHAR, Faults, start_with_faulty

SENTENCES = ["First sentence here.", "Second one LOST here.", "Third and last."]


@pytest.fixture
def faulty(tmp_path: Path) -> Iterator[tuple[LiveServer, Faults]]:
    faults = Faults()
    server = start_with_faulty(tmp_path, faults, preload=[MODEL], idle_ttl=-1,
                               data_dir=tmp_path / "data", jobs_segment_chars=25,
                               cache_max_items=0)
    yield server, faults
    server.stop()


def _job(live: LiveServer) -> dict[str, object]:
    with live.client() as client:
        made = client.post("/v1/audio/jobs", json={
            "model": MODEL, "input": " ".join(SENTENCES), "response_format": "wav"})
        assert made.status_code == 202, made.text
        return wait_job(client, made.json()["id"], until=("done", "failed"), timeout=60)


def test_a_job_goes_on_after_its_engine_is_lost(faulty: tuple[LiveServer, Faults]) -> None:
    live, faults = faulty
    faults.losses = 1
    card = _job(live)
    assert card["status"] == "done", card
    assert faults.lost_calls == 2  # lost once, rendered again once
    with live.client() as client:
        audio = decode(client.get(f"/v1/audio/jobs/{card['id']}/audio").content, "wav")
    spoken = sum(len(s) for s in SENTENCES) * SECONDS_PER_CHAR
    assert audio.duration == pytest.approx(spoken, abs=0.6)


def test_a_segment_lost_twice_fails_its_job(faulty: tuple[LiveServer, Faults]) -> None:
    live, faults = faulty
    faults.losses = 10
    card = _job(live)
    assert card["status"] == "failed", card
    assert faults.lost_calls == 2
    error = card["error"]
    assert isinstance(error, dict) and error["code"] == "synthesis_failed"
    assert "engine replica stopped" in str(error["message"])
