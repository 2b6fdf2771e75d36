"""`POST /v1/audio/batch`: many speech bodies in, one ZIP out, read back as a client would.

Every file named in the manifest decodes (PyAV) at the length the manifest gives; each entry
repeats what its item asked (model and voice as sent); a bad item carries its error in OpenAI's
shape and the others are spoken anyway. Above `batch_max_items` (3 here) the answer is 202 and a
job whose result is the same kind of ZIP.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

from tests.app.jobs.conftest import wait_job
from tests.conftest import LiveServer, decode

ITEMS: list[dict[str, Any]] = [
    {"model": "espeak", "voice": "en-us", "input": "The first item, in wave form.",
     "response_format": "wav"},
    {"model": "espeak", "voice": "no-such-voice", "input": "Never spoken."},
    {"model": "espeak", "voice": {"id": "en-gb"}, "input": "The third item is Opus.",
     "response_format": "opus", "speed": 1.5},
]


def read(data: bytes) -> tuple[zipfile.ZipFile, list[dict[str, Any]]]:
    archive = zipfile.ZipFile(io.BytesIO(data))
    return archive, json.loads(archive.read("manifest.json"))["items"]


def check(archive: zipfile.ZipFile, manifest: list[dict[str, Any]],
          items: list[dict[str, Any]]) -> None:
    assert [e["index"] for e in manifest] == list(range(len(items)))
    for entry, item in zip(manifest, items, strict=True):
        fmt = item.get("response_format", "mp3")
        assert (entry["model"], entry["voice"], entry["format"]) == (
            item.get("model"), item.get("voice"), fmt)
        if entry["error"] is None:
            assert entry["file"] == f"{entry['index'] + 1:03d}.{fmt}"
            audio = decode(archive.read(entry["file"]), fmt)
            assert audio.rms > 0.01
            assert abs(audio.duration - entry["duration_s"]) < 0.1, (audio.duration, entry)
        else:
            assert entry["file"] is None and entry["duration_s"] is None
            assert set(entry["error"]) == {"message", "type", "param", "code"}
    names = {e["file"] for e in manifest if e["file"]} | {"manifest.json"}
    assert set(archive.namelist()) == names


def test_a_batch_answers_a_zip_every_item_decodes_and_a_bad_one_fails_alone(
        espeak_server: LiveServer) -> None:
    with espeak_server.client(headers={"Authorization": "Bearer key-a"}) as client:
        response = client.post("/v1/audio/batch", json={"items": ITEMS})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    archive, manifest = read(response.content)
    check(archive, manifest, ITEMS)
    voice = manifest[1]["error"]
    assert (voice["type"], voice["code"], voice["param"]) == (
        "invalid_request_error", "voice_not_found", "voice")
    assert manifest[0]["error"] is None and manifest[2]["error"] is None
    # the faster item is shorter for its words: speed reached the engine
    assert manifest[2]["duration_s"] < manifest[0]["duration_s"]


def test_an_item_that_is_not_a_speech_body_carries_a_validation_error(
        espeak_server: LiveServer) -> None:
    items = [{"model": "espeak", "voice": "en-us"}, {"model": "espeak", "input": "Fine."}]
    with espeak_server.client() as client:
        response = client.post("/v1/audio/batch", json={"items": items})
    archive, manifest = read(response.content)
    check(archive, manifest, items)
    assert manifest[0]["error"]["param"] == "input"
    assert manifest[1]["file"] == "002.mp3"


def test_a_batch_above_the_setting_becomes_a_job_whose_result_is_the_zip(
        espeak_server: LiveServer) -> None:
    items = [*ITEMS, {"model": "espeak", "input": "A fourth, in FLAC.",
                      "response_format": "flac"}]
    with espeak_server.client(headers={"Authorization": "Bearer key-a"}) as client:
        response = client.post("/v1/audio/batch", json={"items": items})
        assert response.status_code == 202, response.text
        job = response.json()
        assert job["status"] in ("queued", "running") and job["kind"] == "batch"
        assert wait_job(client, job["id"])["status"] == "done"
        result = client.get(f"/v1/audio/jobs/{job['id']}/audio")
    assert result.status_code == 200
    assert result.headers["content-type"] == "application/zip"
    archive, manifest = read(result.content)
    check(archive, manifest, items)
    assert manifest[1]["error"]["code"] == "voice_not_found"


def test_a_batch_of_too_many_items_is_refused_before_it_is_parsed(
        espeak_server: LiveServer) -> None:
    """Counted from the body a piece at a time (FastAPI parsed a 32 MB body on the event loop
    first: 1.3 s); the budget's error names its setting."""
    with espeak_server.client(headers={"Authorization": "Bearer key-a"}) as client:
        response = client.post("/v1/audio/batch", content=b'{"items": [' + b",".join(
            [b"{}"] * 20_000) + b"]}", headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "over_budget" and "VOXMUX_BATCH_MAX_JOB_ITEMS" in error["message"]
