"""A job's cost bounded in what it costs: its audio (`jobs_max_audio_seconds`), refused at once
when its text alone shows it would pass the budget, else failed when the audio stored gets there;
and its bytes, every one given back when a job is purged, even in the instant a segment of it is
being stored (a byte left counted is a false 507 later)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.app.jobs.conftest import wait_job
from tests.conftest import LiveServer, start_server, test_settings

BUDGET_S = 20.0
SENTENCE = "The old ferry crossed the grey river twice every morning. "  # 47 letters


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("costs")
    server = start_server(test_settings(tmp, preload=["espeak"], idle_ttl=-1,
                                        data_dir=tmp / "data", jobs_segment_chars=120,
                                        jobs_max_audio_seconds=BUDGET_S))
    yield server
    server.stop()


def post(live: LiveServer, **body: Any) -> Any:
    with live.client() as client:
        return client.post("/v1/audio/jobs", json={"model": "espeak", "voice": "en-us",
                                                   "response_format": "wav", **body})


@pytest.mark.parametrize("body", [
    {"input": SENTENCE * 22},  # 1,034 letters: at least 26 s of speech at any voice's pace
    {"items": [{"input": SENTENCE * 11}, {"input": SENTENCE * 11}]},  # the same, in two
    {"input": SENTENCE * 11, "speed": 0.5},  # half as many letters, read at half the speed
], ids=["text", "items", "slow"])
def test_a_job_whose_text_passes_the_audio_budget_is_refused_at_once(
        live: LiveServer, body: dict[str, Any]) -> None:
    with live.client() as client:
        before = [j["id"] for j in client.get("/v1/audio/jobs").json()["data"]]
    answer = post(live, **body)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "over_budget"
    assert "VOXMUX_JOBS_MAX_AUDIO_SECONDS" in error["message"], error
    with live.client() as client:
        after = [j["id"] for j in client.get("/v1/audio/jobs").json()["data"]]
        assert after == before  # nothing stored


def test_a_job_whose_audio_passes_the_budget_fails_when_it_gets_there(live: LiveServer) -> None:
    """600 letters (15 s at the fastest pace there is) that eSpeak NG reads in about 40 s."""
    answer = post(live, input=SENTENCE * 13)
    assert answer.status_code == 202, answer.text[:300]
    with live.client() as client:
        failed = wait_job(client, answer.json()["id"], until=("failed", "done"))
        assert failed["status"] == "failed", failed["progress"]
        assert failed["error"]["code"] == "over_budget", failed["error"]
        assert "VOXMUX_JOBS_MAX_AUDIO_SECONDS" in failed["error"]["message"]
        progress = failed["progress"]
        assert 0 < progress["done"] < progress["total"]
        assert BUDGET_S / 2 < progress["audio_seconds"] <= BUDGET_S
        speech = client.post("/v1/audio/speech", json={"model": "espeak", "input": "Still here."})
        assert speech.status_code == 200


def test_a_purge_while_a_segment_is_stored_gives_back_every_byte(
        live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The purge lands after the segment's file is in place, before its row says so."""
    store = live.app.state.jobs.store
    data_dir = Path(live.app.state.settings.data_dir).resolve()
    stored = threading.Event()
    replace = os.replace

    def slow_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        replace(src, dst, *args, **kwargs)
        path = Path(os.fsdecode(dst)).resolve()
        if path.suffix == ".pcm" and data_dir in path.parents and not stored.is_set():
            stored.set()
            time.sleep(0.5)  # the purge comes in now

    monkeypatch.setattr(os, "replace", slow_replace)
    before = store.used
    answer = post(live, input=SENTENCE * 6)
    assert answer.status_code == 202, answer.text[:300]
    job_id = answer.json()["id"]
    assert stored.wait(30)
    with live.client() as client:
        purged = client.delete(f"/v1/audio/jobs/{job_id}", params={"purge": "true"})
        assert purged.status_code == 200, purged.text
        assert client.get(f"/v1/audio/jobs/{job_id}").status_code == 404
    deadline = time.monotonic() + 5
    while store.used != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.used == before, f"{store.used - before} bytes still counted"
    time.sleep(0.2)
    assert not (data_dir / "jobs" / job_id).exists()
