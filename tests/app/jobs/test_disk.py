"""A full store fails the job cleanly, never the server: under the store's own bound
(`jobs_max_bytes`) and on a "disk" that refuses to grow a file (RLIMIT_FSIZE: writes fail with
EFBIG, as they fail with ENOSPC on a full disk; no root needed). Either way the job ends `failed`
with `disk_full`, nothing half-written counts as a segment, and the same process goes on serving
speech. Finished jobs past their retention are deleted with their files."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from app.jobs.model import DiskFull, Item, ItemOptions, Job, Segment
from app.jobs.store import JobStore
from tests.app.jobs.conftest import wait_job
from tests.app.jobs.test_resume import server
from tests.conftest import start_server, test_settings

TEXT = "The store fills up long before this story ends. " * 200


@pytest.mark.parametrize("limits", [{"jobs_max_bytes": "300000"}, {"file_limit": 400_000}],
                         ids=["store-bound", "file-too-large"])
def test_a_full_store_fails_the_job_and_the_server_keeps_serving(
        tmp_path: Path, limits: dict[str, object]) -> None:
    file_limit = limits.pop("file_limit", None)
    settings = {k: str(v) for k, v in limits.items()}
    with server(tmp_path, file_limit=file_limit, **settings) as (url, process), \
            httpx.Client(base_url=url, timeout=60) as client:
        job = client.post("/v1/audio/jobs", json={
            "model": "espeak", "voice": "en-us", "input": TEXT, "response_format": "wav"}).json()
        failed = wait_job(client, job["id"], until=("failed", "done"))
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "disk_full"
        assert failed["error"]["type"] == "server_error"
        assert failed["progress"]["done"] < failed["progress"]["total"]
        speech = client.post("/v1/audio/speech", json={
            "model": "espeak", "input": "Still here.", "response_format": "wav"})
        assert speech.status_code == 200 and len(speech.content) > 10_000
        assert client.get("/health").status_code == 200
        assert process.poll() is None
    with sqlite3.connect(tmp_path / "jobs.sqlite3") as db:
        done, = db.execute("SELECT COUNT(samples) FROM segments").fetchone()
    files = list((tmp_path / "jobs" / job["id"]).iterdir())
    assert [f.suffix for f in files] == [".pcm"] * done  # no partial file left behind


def test_finished_jobs_past_retention_are_deleted(tmp_path: Path) -> None:
    store = JobStore(tmp_path, max_bytes=10_000_000)
    now = time.time()
    for name, finished in (("job_old", now - 7200), ("job_new", now - 60)):
        store.create(Job(name, "anonymous", "book", "queued", now, now, {}),
                     [Item(0, "", "Hello.", ItemOptions("espeak"), sample_rate=22050)],
                     [Segment(0, 0, 0, "Hello.", 0)])
        store.finish_segment(name, 0, b"\0\0" * 1000, [])
        store.set_status(name, "done")
        with store._write() as db:
            db.execute("UPDATE jobs SET finished = ? WHERE id = ?", (finished, name))
    each = 2000 + 2 * len("Hello.")  # the audio, and the text as chapter and as segment
    assert store.used == 2 * each
    assert store.expired(now - 3600) == ["job_old"]
    store.delete("job_old")
    assert store.job("job_old") is None and not (tmp_path / "jobs" / "job_old").exists()
    assert store.used == each and store.job("job_new") is not None
    reopened = JobStore(tmp_path, max_bytes=10_000_000)
    assert reopened.used == each


def test_a_job_whose_text_does_not_fit_is_refused(tmp_path: Path) -> None:
    store = JobStore(tmp_path, max_bytes=100)
    text = "A long chapter. " * 10
    with pytest.raises(DiskFull):
        store.create(Job("job_big", "anonymous", "book", "queued", 0, 0, {}),
                     [Item(0, "", text, ItemOptions("espeak"))], [Segment(0, 0, 0, text, 0)])
    assert store.job("job_big") is None and store.used == 0


def test_a_data_dir_that_cannot_be_written_leaves_everything_but_jobs_serving(
        tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the data dir should be")
    live = start_server(test_settings(tmp_path, preload=["espeak"], data_dir=blocked))
    try:
        with live.client() as client:
            job = client.post("/v1/audio/jobs", json={"model": "espeak", "input": "Hello."})
            assert job.status_code == 503
            assert job.json()["error"]["code"] == "job_store_unavailable"
            assert client.get("/v1/audio/jobs").status_code == 503
            batch = client.post("/v1/audio/batch", json={"items": [
                {"model": "espeak", "input": "Still fine."}]})
            assert batch.status_code == 200
            speech = client.post("/v1/audio/speech", json={"model": "espeak", "input": "Hi."})
            assert speech.status_code == 200
            panel = client.get("/studio/fragments/jobs")
            assert panel.status_code == 286 and "cannot be opened" in panel.text
    finally:
        live.stop()
