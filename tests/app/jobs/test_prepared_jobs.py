"""Long-form work is prepared as any request is: SSML and the creator's lexicons are heard in
jobs and in batches large enough to become jobs, sample for sample as on the speech routes
(eSpeak NG is deterministic), and a chapter's captions quote the SSML's words, not its tags."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import numpy as np
import pytest

from tests.app.jobs.conftest import wait_job
from tests.conftest import LiveServer, decode

KEY = {"Authorization": "Bearer key-b"}
SSML = '<speak>Hello.<break time="5s"/>World.</speak>'


def _zip_audio(data: bytes) -> list[np.ndarray]:
    archive = zipfile.ZipFile(io.BytesIO(data))
    manifest = json.loads(archive.read("manifest.json"))["items"]
    assert all(entry["error"] is None for entry in manifest), manifest
    return [decode(archive.read(entry["file"]), "wav").samples for entry in manifest]


def test_a_batch_item_sounds_the_same_alone_and_in_a_batch_that_became_a_job(
        espeak_server: LiveServer) -> None:
    """A batch of one is answered at once; one over `batch_max_items` (3 here) becomes a job.
    Either way an SSML item's break is in its audio (a job used to read the tags aloud)."""
    item = {"model": "espeak", "input": SSML, "response_format": "wav"}
    with espeak_server.client(headers=KEY) as client:
        alone = client.post("/v1/audio/batch", json={"items": [item]})
        assert alone.status_code == 200
        queued = client.post("/v1/audio/batch", json={"items": [item] * 5})
        assert queued.status_code == 202, queued.text
        done = wait_job(client, queued.json()["id"])
        assert done["status"] == "done", done
        result = client.get(f"/v1/audio/jobs/{done['id']}/zip")
    one, in_job = _zip_audio(alone.content)[0], _zip_audio(result.content)
    assert len(one) / 22_050 > 5  # the break is heard
    assert all(np.array_equal(one, audio) for audio in in_job)


def test_a_jobs_chapter_reads_ssml_and_the_creators_lexicon_as_speech_does(
        espeak_server: LiveServer) -> None:
    """The same text as a speech request and as a job's chapter: the same samples, SSML
    compiled and the key's lexicon applied in both; the chapter's captions quote the words."""
    text = ('<speak>The <sub alias="World Wide Web Consortium">W3C</sub> met Blorvek.'
            '<break time="1500ms"/>Then it rained.</speak>')
    with espeak_server.client(headers=KEY) as client:
        created = client.post("/v1/audio/lexicons", json={
            "name": "jobs", "language": "en", "entries": {"Blorvek": "Bellamy"}})
        assert created.status_code == 201, created.text
        try:
            speech = client.post("/v1/audio/speech", json={
                "model": "espeak", "input": text, "response_format": "wav"})
            job = client.post("/v1/audio/jobs", json={
                "model": "espeak", "input": text, "response_format": "wav"}).json()
            done = wait_job(client, job["id"])
            assert done["status"] == "done", done
            chapter = client.get(done["chapters"][0]["audio"])
            vtt = client.get(done["chapters"][0]["captions"]["vtt"]).text
        finally:
            client.delete("/v1/audio/lexicons/jobs")
    assert speech.status_code == 200 and chapter.status_code == 200
    spoken, read = decode(speech.content, "wav"), decode(chapter.content, "wav")
    assert np.array_equal(spoken.samples, read.samples)
    assert "<" not in vtt and "W3C" in vtt and "Blorvek" in vtt


@pytest.mark.parametrize("body", [
    {"input": SSML, "input_format": "ssml"},
    {"input": SSML},  # detected from its <speak>, as on the speech route
    {"items": [{"input": SSML, "title": "Not spoken: the document is whole"}]},
], ids=["input_format", "detected", "item"])
def test_a_job_of_ssml_makes_the_speech_routes_audio(espeak_server: LiveServer,
                                                     body: dict[str, Any]) -> None:
    with espeak_server.client(headers=KEY) as client:
        speech = client.post("/v1/audio/speech", json={
            "model": "espeak", "input": SSML, "response_format": "wav"})
        job = client.post("/v1/audio/jobs", json={
            "model": "espeak", "response_format": "wav", **body}).json()
        done = wait_job(client, job["id"])
        assert done["status"] == "done", done
        chapter = client.get(done["chapters"][0]["audio"])
    assert np.array_equal(decode(speech.content, "wav").samples,
                          decode(chapter.content, "wav").samples)
