"""Reading a job back costs what is read, off the event loop: a job's card with tens of thousands
of chapters is built and serialized in a worker thread, a chapter's routes read that chapter
alone, the job list is paged, and a job's ZIP is written as each chapter is encoded (never a
whole chapter in memory), its reservation given back whatever happens to the file."""

from __future__ import annotations

import time
import uuid
import wave
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.jobs.model import Item, ItemOptions, Job, Segment
from tests.app.jobs.conftest import wait_job
from tests.app.jobs.test_epub_budget import PeakRss
from tests.app.jobs.test_loop import HealthWatch
from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.loop_guard import OnLoop

RATE = 22_050


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("result-costs")
    server = start_server(test_settings(tmp, preload=["espeak"], idle_ttl=-1,
                                        data_dir=tmp / "data", api_keys="key-a,key-b"))
    yield server
    server.stop()


KEY = {"Authorization": "Bearer key-a"}


def stored(live: LiveServer, chapters: int, owner: str = "anonymous",
           audio: list[bytes] | None = None) -> str:
    """A job as the runner leaves one, put in the server's store directly: `chapters` items of
    one segment each, or one item whose segments are `audio` (16-bit PCM), stored and done."""
    store = live.app.state.jobs.store
    now = time.time()
    job = Job("job_" + uuid.uuid4().hex, owner, "book", "running", now, now,
              {"model": "espeak", "response_format": "wav", "title": "Stored"})
    options = ItemOptions("espeak", "en-us", response_format="wav")
    if audio is None:
        items = [Item(n, f"Chapter {n + 1}", f"Words {n}.", options, sample_rate=RATE)
                 for n in range(chapters)]
        segments = [Segment(n, n, 0, f"Words {n}.", 0) for n in range(chapters)]
    else:
        items = [Item(0, "Long", "A long chapter.", options, sample_rate=RATE)]
        segments = [Segment(n, 0, n, "A long chapter.", 0) for n in range(len(audio))]
    store.create(job, items, segments)
    for seq, pcm in enumerate(audio or []):
        store.finish_segment(job.id, seq, pcm, [])
    store.set_status(job.id, "done" if audio is not None else "cancelled")
    return job.id


def test_a_card_of_100000_chapters_is_built_off_the_event_loop(
        live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`GET /v1/audio/jobs/{id}` built each chapter's line and serialized the card on the
    event loop (400,000 chapters: 12.4 s for the answer; 100,000: `/health` waited 0.32 s)."""
    from app.jobs import front
    job = stored(live, 100_000)
    on_loop = OnLoop(monkeypatch).guard(front, ["card_body", "_chapter", "_json"])
    on_loop.guard(live.app.state.jobs.store, ["counts", "summaries", "items", "segments"])
    try:
        with live.client() as client, HealthWatch(live.url) as health:
            answer = client.get(f"/v1/audio/jobs/{job}")
        assert answer.status_code == 200
        card = answer.json()
        assert card["id"] == job and card["status"] == "cancelled"
        assert len(card["chapters"]) == 100_000
        assert card["chapters"][-1] == {
            "index": 100_000, "title": "Chapter 100000", "chars": len("Words 99999."),
            "ready": False, "duration_s": None, "audio": None, "captions": None, "error": None}
        assert answer.headers["content-type"] == "application/json"
        assert on_loop.calls == []
        assert max(health.times) < 1.0, f"/health took {max(health.times):.2f} s"
    finally:
        live.app.state.jobs.store.delete(job)


def test_a_chapters_routes_read_that_chapter_only(live: LiveServer,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each chapter's audio and captions read that item, never every item's text (400,000
    items: 8.4 s per chapter)."""
    with live.client() as client:
        answer = client.post("/v1/audio/jobs", json={
            "model": "espeak", "voice": "en-us", "response_format": "wav",
            "items": [{"input": f"Chapter number {n}.", "title": f"T{n}"} for n in range(3)]})
        assert answer.status_code == 202, answer.text
        done = wait_job(client, answer.json()["id"])
        assert done["status"] == "done", done
        store = live.app.state.jobs.store

        def every_item(job_id: str) -> Any:
            raise AssertionError("a chapter route read every item")

        monkeypatch.setattr(store, "items", every_item)
        audio = client.get(done["chapters"][1]["audio"])
        captions = client.get(done["chapters"][1]["captions"]["vtt"])
        missing = client.get(f"/v1/audio/jobs/{done['id']}/chapters/4/audio")
    assert audio.status_code == 200 and decode(audio.content, "wav").duration > 0.5
    assert captions.status_code == 200 and "number" in captions.text
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "chapter"
    assert "1 to 3" in missing.json()["error"]["message"]


def test_the_job_list_is_paged_newest_first(live: LiveServer) -> None:
    jobs = [stored(live, 1, owner="key:" + _digest("key-b")) for _ in range(5)]
    try:
        with live.client(headers={"Authorization": "Bearer key-b"}) as client:
            first = client.get("/v1/audio/jobs", params={"limit": 2}).json()
            assert [j["id"] for j in first["data"]] == jobs[::-1][:2]
            assert first["has_more"] is True and first["last_id"] == jobs[3]
            rest = client.get("/v1/audio/jobs", params={"limit": 10,
                                                        "after": first["last_id"]}).json()
            assert [j["id"] for j in rest["data"]] == jobs[::-1][2:]
            assert rest["has_more"] is False
            whole = client.get("/v1/audio/jobs").json()
            assert [j["id"] for j in whole["data"]] == jobs[::-1]
            assert all(j["chapters"] is None for j in whole["data"])
            refused = client.get("/v1/audio/jobs", params={"limit": 0})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"
            unknown = client.get("/v1/audio/jobs", params={"after": "job_nope"})
            assert unknown.status_code == 404
    finally:
        for job in jobs:
            live.app.state.jobs.store.delete(job)


def _digest(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:16]


def test_a_zip_holds_no_chapter_whole_in_memory(live: LiveServer, tmp_path: Path) -> None:
    """One chapter of 50 minutes of wav (132 MB): `GET .../zip` joined its encoded audio in
    memory before writing it (12,951 s: +1.08 GB)."""
    ten_seconds = (np.sin(np.arange(10 * RATE) * 0.05) * 8000).astype("<i2").tobytes()
    job = stored(live, 1, audio=[ten_seconds] * 300)
    target = tmp_path / "result.zip"
    try:
        with live.client() as client, PeakRss() as rss, \
                client.stream("GET", f"/v1/audio/jobs/{job}/zip") as answer, \
                open(target, "wb") as handle:
            assert answer.status_code == 200
            for chunk in answer.iter_bytes():
                handle.write(chunk)
        print(f"+{rss.growth_mb:.0f} MB for a ZIP of {target.stat().st_size:,} bytes")
        assert rss.growth_mb < 100, f"the server grew by {rss.growth_mb:.0f} MB"
        with zipfile.ZipFile(target) as archive:
            assert archive.testzip() is None
            assert archive.getinfo("001.wav").file_size == 44 + 2 * 300 * 10 * RATE
            with archive.open("001.wav") as member, wave.open(member) as audio:
                assert audio.getframerate() == RATE
                start = np.frombuffer(audio.readframes(RATE), dtype="<i2")
            assert np.abs(start - np.frombuffer(ten_seconds[:2 * RATE], "<i2")).max() <= 1
    finally:
        live.app.state.jobs.store.delete(job)


def test_a_zip_reservation_is_given_back_when_a_purge_takes_the_file(
        live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A purge between the ZIP's reservation and its rename left the reservation counted for
    good (its `FileNotFoundError` escaped): the store filled up with bytes of nothing."""
    store = live.app.state.jobs.store
    job = stored(live, 1, audio=[bytes(2 * RATE)])
    used = store.used - store.job(job).bytes
    reserve = store.reserve

    def purged_meanwhile(size: int) -> None:
        reserve(size)
        store.delete(job)  # a DELETE ?purge=true lands right after the reservation

    monkeypatch.setattr(store, "reserve", purged_meanwhile)
    with live.client() as client:
        answer = client.get(f"/v1/audio/jobs/{job}/zip")
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "job_not_found"
    assert store.used == used
