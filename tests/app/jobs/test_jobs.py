"""`/v1/audio/jobs` as a client uses it: a book in (Markdown, EPUB, a list of items), 202 and an
id, progress by polling and by SSE, the whole audio, each chapter's audio and captions, one ZIP;
cancel; jobs seen only by the key that made them; a book of more than 1,000 segments."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest
import srt
import webvtt

from tests.app.jobs.conftest import wait_job
from tests.conftest import LiveServer, decode
from tests.epubs import make_epub

KEY_A = {"Authorization": "Bearer key-a"}
KEY_B = {"Authorization": "Bearer key-b"}
PARAGRAPH = ("The river ran slowly past the old mill, and the miller watched it from his "
             "door. ")
MARKDOWN = ("# The River\n\n" + PARAGRAPH * 6 + "\n\n## A smaller heading\n\nStill the first "
            "chapter.\n\n# The *Mill*\n\n" + PARAGRAPH * 5 + "\n\n# The Sea\n\nShort and "
            "**bold** at the end.\n")


def make_job(client: httpx.Client, **body: object) -> dict[str, object]:
    response = client.post("/v1/audio/jobs", json={"model": "espeak", "voice": "en-us", **body})
    assert response.status_code == 202, response.text
    job: dict[str, object] = response.json()
    assert job["status"] in ("queued", "running") and str(job["id"]).startswith("job_")
    return job


def test_a_markdown_book_becomes_chapters_with_audio_captions_and_a_zip(
        espeak_server: LiveServer) -> None:
    with espeak_server.client(headers=KEY_A) as client:
        job = make_job(client, input=MARKDOWN, input_format="markdown",
                       response_format="mp3", title="Three chapters")
        done = wait_job(client, str(job["id"]))
        assert done["status"] == "done", done
        progress = done["progress"]
        assert progress["done"] == progress["total"] > 0 and progress["eta_seconds"] == 0
        chapters = done["chapters"]
        assert [c["title"] for c in chapters] == ["The River", "The Mill", "The Sea"]
        whole = client.get(f"/v1/audio/jobs/{job['id']}/audio")
        assert whole.status_code == 200 and whole.headers["content-type"] == "audio/mpeg"
        audio = decode(whole.content, "mp3")
        seconds = sum(c["duration_s"] for c in chapters)
        pauses = 2 * espeak_server.app.state.settings.chapter_pause_ms / 1000
        assert abs(audio.duration - (seconds + pauses)) < 0.2
        assert abs(progress["audio_seconds"] - seconds) < 0.01
        second = client.get(chapters[1]["audio"])
        assert abs(decode(second.content, "mp3").duration - chapters[1]["duration_s"]) < 0.1
        subtitles = list(srt.parse(client.get(chapters[1]["captions"]["srt"]).text))
        assert subtitles[0].content.startswith("The Mill.")
        assert subtitles[-1].end.total_seconds() <= chapters[1]["duration_s"] + 0.01
        vtt = webvtt.from_buffer(io.StringIO(client.get(chapters[2]["captions"]["vtt"]).text))
        assert "bold" in " ".join(c.text for c in vtt)
        result = client.get(f"/v1/audio/jobs/{job['id']}/zip")
        archive = zipfile.ZipFile(io.BytesIO(result.content))
        manifest = json.loads(archive.read("manifest.json"))["items"]
        assert [e["file"] for e in manifest] == ["001.mp3", "002.mp3", "003.mp3"]
        assert {"001.srt", "001.vtt", "003.vtt"} <= set(archive.namelist())
        for entry in manifest:
            assert abs(decode(archive.read(entry["file"]), "mp3").duration
                       - entry["duration_s"]) < 0.1
    outputs = espeak_server.app.state.settings.outputs_dir
    kept = [p for p in Path(outputs).glob(f"*{job['id']}.mp3")]
    assert len(kept) == 1
    sidecar = json.loads(kept[0].with_name(kept[0].name + ".json").read_text())
    assert sidecar["job_id"] == job["id"] and len(sidecar["chapters"]) == 3


def test_an_epub_is_read_chapter_by_chapter(espeak_server: LiveServer) -> None:
    data = make_epub([(title, f"<p>{text}</p><p>Another line here.</p>") for title, text in [
        ("First Light", "Morning came over the hills."),
        ("Night Falls", "The stars came out one by one.")]], title="A small book",
        nav_in_spine=True)
    with espeak_server.client() as client:
        job = make_job(client, input=base64.b64encode(data).decode(),
                       input_format="epub", response_format="wav")
        done = wait_job(client, str(job["id"]))
        assert [c["title"] for c in done["chapters"]][-2:] == ["First Light", "Night Falls"]
        assert done["status"] == "done"


def test_items_carry_their_own_voice_and_speed(espeak_server: LiveServer) -> None:
    with espeak_server.client() as client:
        job = make_job(client, response_format="flac", items=[
            {"input": "One voice speaks here.", "title": "One"},
            {"input": "One voice speaks here.", "voice": "en-gb", "speed": 2.0}])
        done = wait_job(client, str(job["id"]))
        first, second = done["chapters"]
        assert second["duration_s"] < first["duration_s"] * 0.7
        assert first["title"] == "One"


def test_progress_streams_as_server_sent_events(espeak_server: LiveServer) -> None:
    with espeak_server.client() as client:
        job = make_job(client, input=PARAGRAPH * 40)
        with client.stream("GET", f"/v1/audio/jobs/{job['id']}/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: ")]
    assert events[-1]["type"] == "job.done"
    done = [e["progress"]["done"] for e in events]
    assert done == sorted(done) and done[-1] == events[-1]["progress"]["total"]


def test_delete_cancels_a_running_job(espeak_server: LiveServer) -> None:
    with espeak_server.client() as client:
        job = make_job(client, input=PARAGRAPH * 2000)  # ~170,000 characters
        wait_job(client, str(job["id"]), until=("running",))
        cancelled = client.delete(f"/v1/audio/jobs/{job['id']}").json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["progress"]["done"] < cancelled["progress"]["total"]
        after = wait_job(client, str(job["id"]), until=("cancelled",))
        assert after["progress"]["done"] == cancelled["progress"]["done"]
        refused = client.get(f"/v1/audio/jobs/{job['id']}/audio")
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "job_not_finished"
        purged = client.delete(f"/v1/audio/jobs/{job['id']}", params={"purge": "true"})
        assert purged.status_code == 200
        assert client.get(f"/v1/audio/jobs/{job['id']}").status_code == 404


@pytest.mark.parametrize("other", [KEY_B, {}])
def test_a_job_belongs_to_the_key_that_made_it(espeak_server: LiveServer,
                                               other: dict[str, str]) -> None:
    with espeak_server.client(headers=KEY_A) as owner:
        job = make_job(owner, input="Mine alone.")
        assert any(j["id"] == job["id"] for j in owner.get("/v1/audio/jobs").json()["data"])
    with espeak_server.client(headers=other) as stranger:
        for path in ("", "/audio", "/events", "/zip", "/chapters/1/audio"):
            response = stranger.get(f"/v1/audio/jobs/{job['id']}{path}")
            assert response.status_code == 404, (path, response.text)
            assert response.json()["error"]["code"] == "job_not_found"
        assert stranger.delete(f"/v1/audio/jobs/{job['id']}").status_code == 404
        assert all(j["id"] != job["id"] for j in stranger.get("/v1/audio/jobs").json()["data"])


def test_a_book_of_more_than_a_thousand_segments_is_planned_and_runs(
        espeak_server: LiveServer) -> None:
    """1,100 items of one word each: 1,100 segments stored row by row and file by file."""
    with espeak_server.client() as client:
        job = make_job(client, response_format="wav",
                       items=[{"input": f"Word {n}."} for n in range(1100)])
        assert job["progress"]["total"] == 1100
        done = wait_job(client, str(job["id"]), timeout=240)
        assert done["status"] == "done", done["progress"]
        assert len(done["chapters"]) == 1100
        last = client.get(done["chapters"][-1]["audio"])
        assert decode(last.content, "wav").rms > 0.01


def test_jobs_segment_chars_bounds_a_job_segment(espeak_server: LiveServer,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """How long an interactive request may wait behind a job is one of its segments."""
    service = espeak_server.app.state.service
    text = PARAGRAPH * 40
    whole = asyncio.run(service.plan(model="espeak", text=text, long=True)).segments
    monkeypatch.setattr(service.settings, "jobs_segment_chars", 120)
    short = asyncio.run(service.plan(model="espeak", text=text, long=True)).segments
    assert max(map(len, whole)) > 300 and max(map(len, short)) <= 120
    assert " ".join(short).split() == text.split()


@pytest.mark.parametrize("ssml", [False, True], ids=["text", "ssml"])
def test_a_chapter_rendered_in_parts_at_once_is_the_chapter_rendered_in_order(
        espeak_server: LiveServer, monkeypatch: pytest.MonkeyPatch, ssml: bool) -> None:
    """`jobs_parallel` (on a cluster: one part per engine replica) renders a chapter's segments
    as parts at once; each part's plan ends where the part does, and the chapter joins sample
    for sample as the one rendered in order does (eSpeak NG is deterministic), SSML breaks and
    tempo included (each part is planned from the cut the job stored)."""
    runner = espeak_server.app.state.jobs
    service = runner.service
    monkeypatch.setattr(service.settings, "jobs_segment_chars", 120)
    text = PARAGRAPH * 12
    if ssml:
        text = ('<speak><break time="1s"/>' + PARAGRAPH * 4 + '<break time="700ms"/>'
                '<prosody rate="slow">' + PARAGRAPH * 4 + "</prosody>" + PARAGRAPH * 4
                + '<break time="2s"/></speak>')
    starts: list[int] = []
    replan = service.replan

    def spied(**fields: object) -> object:
        starts.append(int(fields.get("start", 0)))  # type: ignore[call-overload]
        return replan(**fields)

    monkeypatch.setattr(service, "replan", spied)
    audio = {}
    with espeak_server.client(headers=KEY_A) as client:
        for parallel in (1, 3):
            monkeypatch.setattr(runner.settings, "jobs_parallel", parallel)
            starts.clear()
            job = make_job(client, input=text, response_format="wav")
            done = wait_job(client, str(job["id"]))
            assert done["status"] == "done", done
            audio[parallel] = decode(client.get(done["chapters"][0]["audio"]).content, "wav")
            assert len(starts) == (1 if parallel == 1 else 3), starts
    assert audio[1].duration > 10
    assert np.array_equal(audio[1].samples, audio[3].samples)


@pytest.mark.parametrize(("done", "at_once", "parts"), [
    ([], 1, [(0, 10)]),
    ([0, 1], 1, [(2, 10)]),
    ([], 3, [(0, 4), (4, 8), (8, 10)]),
    ([0, 1, 5], 2, [(2, 5), (6, 10)]),
    (list(range(10)), 4, []),
])
def test_a_chapters_missing_segments_are_cut_into_parts(done: list[int], at_once: int,
                                                        parts: list[tuple[int, int]]) -> None:
    from app.jobs.model import Segment
    from app.jobs.runner import _windows

    segments = [Segment(n, 0, n, "x", 0, 100 if n in done else None) for n in range(10)]
    assert _windows(segments, at_once) == parts


def test_a_resumed_part_never_renders_a_stored_segment_again(
        espeak_server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments 2, 3 and 6 of 8 stored (a job whose parts ran at once, stopped): the part that
    resumes it renders the gaps only (a neural engine would replace stored audio otherwise)."""
    import asyncio
    import time

    from app.jobs.model import Item, ItemOptions, Job, Segment
    from app.jobs.runner import _Run

    runner = espeak_server.app.state.jobs
    store = runner.store
    now = time.time()
    job = Job("job_gaps", "anonymous", "book", "running", now, now, {})
    items = [Item(0, "", "x " * 8, ItemOptions("espeak"), sample_rate=22050)]
    store.create(job, items, [Segment(n, 0, n, "x", 2 * n) for n in range(8)])
    try:
        for seq in (2, 3, 6):
            store.finish_segment(job.id, seq, b"\0\0" * 10, [])
        rendered: list[tuple[int, int]] = []

        async def render(job: Job, item: Item, segments: list[Segment], first: int, stop: int,
                         run: _Run) -> None:
            rendered.append((first, stop))
            for seq in range(first, stop):
                store.finish_segment(job.id, seq, b"\0\0" * 10, [])

        monkeypatch.setattr(runner, "_render", render)
        asyncio.run(runner._part(job, items[0], 0, 8, _Run()))
        assert rendered == [(0, 2), (4, 6), (7, 8)]
    finally:
        store.delete(job.id)
