"""Jobs shared by several VoxMux processes through Redis (`VOXMUX_JOBS_STORE=redis`, what the
ingress replicas of a Ray cluster do): any process answers for any job; a job whose process is
killed with SIGKILL is taken over by another once its lease lapses and finishes sample for sample
as an uninterrupted run (eSpeak NG is deterministic); a cancel sent to one process stops the job
another is running."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import redis

from tests.app.jobs.conftest import wait_job
from tests.app.jobs.test_resume import server
from tests.conftest import LiveServer, decode, free_port, start_server, test_settings
from tests.redisserver import redis_server

TEXT = " ".join(["The lighthouse keeper climbed the stairs at dusk."] * 6 +
                ["Ships passed far out beyond the rocks."] * 6) * 4
SHARED = {"jobs_store": "redis", "jobs_lease_seconds": "2", "jobs_segment_chars": "60",
          "cache_max_items": "0"}


def _job(client: httpx.Client, text: str) -> str:
    answer = client.post("/v1/audio/jobs", json={"model": "espeak", "voice": "en-us",
                                                "input": text, "response_format": "wav"})
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _chapter(client: httpx.Client, job_id: str) -> bytes:
    done = wait_job(client, job_id, timeout=120)
    assert done["status"] == "done", done
    return client.get(done["chapters"][0]["audio"]).content


def _shared(tmp: Path, url: str, **settings: object) -> LiveServer:
    return start_server(test_settings(tmp, preload=["espeak"], idle_ttl=-1, data_dir=tmp / "data",
                                      jobs_store="redis", cache_url=url, cache_max_items=0,
                                      jobs_lease_seconds=2, jobs_segment_chars=60, **settings))


def test_a_job_outlives_its_killed_process_and_a_cancel_reaches_another(tmp_path: Path) -> None:
    """A runs as a `voxmux serve` process of its own, killed for real; B and C, the processes
    that go on, are servers in the test's process."""
    with redis_server(tmp_path / "redis", policy="noeviction") as url:
        with server(tmp_path / "a", **SHARED, cache_url=url) as (url_a, process_a), \
                httpx.Client(base_url=url_a, timeout=60) as a:
            job = _job(a, TEXT)
            wait_job(a, job, until=("running",))
            while a.get(f"/v1/audio/jobs/{job}").json()["progress"]["done"] < 3:
                time.sleep(0.05)
            os.kill(process_a.pid, signal.SIGKILL)
            process_a.wait()
        live_b = _shared(tmp_path / "b", url)
        try:
            with live_b.client() as b:
                card = b.get(f"/v1/audio/jobs/{job}").json()  # B answers for A's job at once
                progress = card["progress"]
                assert card["status"] == "running" and 3 <= progress["done"] < progress["total"]
                resumed = _chapter(b, job)  # once A's lease lapsed, B took it and finished it
                whole = _chapter(b, _job(b, TEXT))  # an uninterrupted run of the same text
                assert decode(resumed, "wav").duration > 75
                assert decode(resumed, "wav").samples.tobytes() == decode(
                    whole, "wav").samples.tobytes()
                # A cancel sent to another process stops the job B runs (B claims the jobs
                # made on it at once; C looks for jobs once a second).
                live_c = _shared(tmp_path / "c", url)
                try:
                    with live_c.client() as c:
                        long = _job(b, TEXT * 8)
                        wait_job(b, long, until=("running",))
                        cancelled = c.delete(f"/v1/audio/jobs/{long}").json()
                        assert cancelled["status"] == "cancelled", cancelled
                        time.sleep(2.5)  # B's runner looks every second
                        first = b.get(f"/v1/audio/jobs/{long}").json()["progress"]["done"]
                        time.sleep(1.5)
                        again = b.get(f"/v1/audio/jobs/{long}").json()
                        assert again["status"] == "cancelled"
                        assert again["progress"]["done"] == first < again["progress"]["total"]
                finally:
                    live_c.stop()
        finally:
            live_b.stop()


def test_a_redis_outage_pauses_jobs_and_they_go_on(tmp_path: Path) -> None:
    """Redis refusing every client mid-job (a password set and the connections dropped: each
    call fails at once, as with a Redis that is down): job routes answer 503 meanwhile and
    speech is served; once Redis takes clients again the job goes on to the end and a new one
    runs (an outage used to end every worker of the process for good)."""
    with redis_server(tmp_path / "redis", policy="noeviction") as url:
        live = _shared(tmp_path, url)
        admin = redis.Redis.from_url(url)
        try:
            with live.client() as client:
                job = _job(client, TEXT)
                while client.get(f"/v1/audio/jobs/{job}").json()["progress"]["done"] < 3:
                    time.sleep(0.05)
                admin.config_set("requirepass", "outage")
                admin.client_kill_filter(_type="normal", skipme=False)
                admin = redis.Redis.from_url(url, password="outage")
                try:
                    time.sleep(3)  # every poll of the workers fails meanwhile
                    assert client.get(f"/v1/audio/jobs/{job}").status_code == 503
                    speech = client.post("/v1/audio/speech", json={
                        "model": "espeak", "input": "Still speaking.", "response_format": "wav"})
                    assert speech.status_code == 200
                finally:
                    admin.config_set("requirepass", "")
                assert len(_chapter(client, job)) > 500_000
                assert len(_chapter(client, _job(client, "A job after the outage."))) > 10_000
        finally:
            admin.close()
            live.stop()


def test_two_workers_of_one_process_never_run_one_job_twice(tmp_path: Path) -> None:
    with redis_server(tmp_path / "redis", policy="noeviction") as url:
        live = _shared(tmp_path, url, jobs_concurrency=3)
        try:
            store = live.app.state.jobs.store
            stored: list[tuple[str, int]] = []
            finish = store.finish_segment

            def counted(job_id: str, seq: int, *args: object) -> None:
                stored.append((job_id, seq))
                finish(job_id, seq, *args)

            store.finish_segment = counted
            with live.client() as client:
                jobs = [_job(client, TEXT[:2000]) for _ in range(3)]
                totals = [wait_job(client, job)["progress"]["total"] for job in jobs]
                assert all(wait_job(client, job)["status"] == "done" for job in jobs)
            assert len(stored) == len(set(stored)) == sum(totals)  # each segment stored once
        finally:
            live.stop()


def test_jobs_wait_for_a_redis_that_starts_after_voxmux(tmp_path: Path) -> None:
    """Compose and Kubernetes start services in any order: jobs answer 503 until Redis is up,
    then work without a restart."""
    port = free_port()
    live = _shared(tmp_path, f"redis://127.0.0.1:{port}/0")
    try:
        with live.client() as client:
            assert client.get("/v1/audio/jobs").status_code == 503
            with redis_server(tmp_path / "redis", policy="noeviction", port=port):
                deadline = time.monotonic() + 20
                while client.get("/v1/audio/jobs").status_code != 200:
                    assert time.monotonic() < deadline, "jobs never became available"
                    time.sleep(0.2)
                assert len(_chapter(client, _job(client, "Redis came up late."))) > 10_000
    finally:
        live.stop()
