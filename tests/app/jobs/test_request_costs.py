"""What a job request costs is bounded before the work it asks for is done, and none of it holds
the event loop: an EPUB's documents are read in one streaming pass (16 MB of XHTML, or a block
nested 250 deep, no longer inflates to a gigabyte), Markdown is parsed slice by slice, text over
`jobs_max_chars` is refused before it is tidied, and a request's items are counted against
`batch_max_job_items` before any of them is validated, in a worker thread.

Each test measures the in-process server (this process: `PeakRss`) and polls `/health` from a
thread of its own (`HealthWatch`) while the request runs.
"""

from __future__ import annotations

import base64
import io
import json
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from app.jobs import book
from tests.app.jobs.conftest import wait_job
from tests.app.jobs.test_epub_budget import CONTAINER, PeakRss
from tests.app.jobs.test_loop import HealthWatch
from tests.conftest import LiveServer, start_server, test_settings

MAX_CHARS = 100_000
MAX_ITEMS = 50
EPUB_MAX_BYTES = 32 * 1024 * 1024
LOOP_S = 1.0
"""The slowest `/health` answer allowed while a request is read (issue 42's bound)."""
GROWTH_MB = 100


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("request-costs")
    server = start_server(test_settings(
        tmp, preload=["espeak"], idle_ttl=-1, data_dir=tmp / "data", jobs_max_chars=MAX_CHARS,
        batch_max_job_items=MAX_ITEMS, epub_max_bytes=EPUB_MAX_BYTES))
    with server.client() as client:  # the first job's one-time costs (what planning loads)
        job = client.post("/v1/audio/jobs", json={"model": "espeak",
                                                  "input": "The river ran past the mill."})
        wait_job(client, job.json()["id"])
        client.delete(f"/v1/audio/jobs/{job.json()['id']}", params={"purge": "true"})
    settle()
    yield server
    server.stop()


def settle() -> None:
    """Wait until this process's memory holds still for a second: what the server loads once
    after it starts (a language identifier of 70 MB) is not what a request costs."""
    process = psutil.Process()
    deadline = time.monotonic() + 30
    last = process.memory_info().rss
    steady = 0
    while steady < 5 and time.monotonic() < deadline:
        time.sleep(0.2)
        now = process.memory_info().rss
        steady = steady + 1 if abs(now - last) < 1_000_000 else 0
        last = now


def send(live: LiveServer, body: dict[str, Any] | bytes) -> tuple[httpx.Response, float,
                                                                  float, float]:
    """POST a job: the answer, seconds it took, the server's RSS growth (MB) and the slowest
    `/health` meanwhile. A 202's job is purged at once (only its answer matters here)."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with live.client() as client, HealthWatch(live.url) as health, PeakRss() as rss:
        started = time.monotonic()
        answer = client.post("/v1/audio/jobs", content=content,
                             headers={"Content-Type": "application/json"})
        took = time.monotonic() - started
        if answer.status_code == 202:
            client.delete(f"/v1/audio/jobs/{answer.json()['id']}", params={"purge": "true"})
    loop = max(health.times, default=0.0)
    print(f"{answer.status_code} in {took:.2f} s, +{rss.growth_mb:.0f} MB, /health {loop:.2f} s")
    return answer, took, rss.growth_mb, loop


def over_budget(answer: httpx.Response, setting: str) -> None:
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "over_budget", error
    assert setting in error["message"], error


# -- EPUB ----------------------------------------------------------------------------------------

OPF = ('<?xml version="1.0" encoding="utf-8"?><package xmlns="http://www.idpf.org/2007/opf" '
       'version="3.0" unique-identifier="id"><metadata '
       'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:identifier id="id">voxmux</dc:identifier>'
       '<dc:title>One document</dc:title><dc:language>en</dc:language></metadata><manifest>'
       '<item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/>{extra}</manifest>'
       '<spine><itemref idref="c1"/></spine></package>')


def epub(body: bytes, media: dict[str, tuple[str, int]] | None = None) -> dict[str, Any]:
    """A job request of an EPUB whose one spine document has `body`, deflated; `media`: name ->
    (media type, bytes of zeros) listed in the manifest, deflated too."""
    extra = "".join(f'<item id="m{n}" href="{name}" media-type="{kind}"/>'
                    for n, (name, (kind, _)) in enumerate((media or {}).items()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", "application/epub+zip", zipfile.ZIP_STORED)
        archive.writestr("META-INF/container.xml", CONTAINER)
        archive.writestr("OEBPS/content.opf", OPF.format(extra=extra))
        archive.writestr("OEBPS/c1.xhtml", b'<?xml version="1.0" encoding="utf-8"?>'
                         b'<html xmlns="http://www.w3.org/1999/xhtml"><body>' + body
                         + b"</body></html>")
        for name, (_, size) in (media or {}).items():
            with archive.open(f"OEBPS/{name}", "w", force_zip64=True) as handle:
                for _ in range(size // (1 << 20)):
                    handle.write(bytes(1 << 20))
    return {"model": "espeak", "voice": "en-us", "response_format": "wav",
            "input_format": "epub", "input": base64.b64encode(buffer.getvalue()).decode()}


def test_a_document_of_16_mb_of_paragraphs_stops_at_the_text_budget(live: LiveServer) -> None:
    """A 24 KB EPUB whose one document is 2,000,000 paragraphs (16 MB of XHTML) took 25 s and
    a gigabyte when the document was parsed whole; read as a stream, it stops once its text
    passes `jobs_max_chars`."""
    body = epub(b"<p>a</p>" * 2_000_000)
    assert len(body["input"]) < 64 * 1024
    answer, took, growth, loop = send(live, body)
    assert growth < GROWTH_MB, f"the server grew by {growth:.0f} MB"
    assert took < 10, took
    assert loop < LOOP_S, f"/health took {loop:.2f} s"
    over_budget(answer, "VOXMUX_JOBS_MAX_CHARS")


def test_a_document_of_2_million_elements_is_read_in_bounded_memory(live: LiveServer) -> None:
    """14 MB of markup with one paragraph of text: every element is read, none is kept."""
    answer, _, growth, loop = send(live, epub(
        b"<div>" + b"<b></b>" * 2_000_000 + b"</div><h1>The End</h1><p>Nothing else.</p>"))
    assert answer.status_code == 202, answer.text[:300]
    assert growth < GROWTH_MB, f"the server grew by {growth:.0f} MB"
    assert loop < LOOP_S, f"/health took {loop:.2f} s"


def test_nested_blocks_are_read_once(live: LiveServer) -> None:
    """250 nested blockquotes around 50,000 characters: each block's text was taken whole, the
    inner blocks' included, so the chapter was 12.5 million characters; it is the 50,000."""
    words = b"word " * 10_000
    body = epub(b"<h1>Deep</h1>" + b"<blockquote>" * 250 + words + b"</blockquote>" * 250)
    with live.client() as client:
        answer = client.post("/v1/audio/jobs", json=body)
        assert answer.status_code == 202, answer.text[:300]
        job = answer.json()["id"]
        try:
            chapters = client.get(f"/v1/audio/jobs/{job}").json()["chapters"]
        finally:
            client.delete(f"/v1/audio/jobs/{job}", params={"purge": "true"})
    assert [c["title"] for c in chapters] == ["Deep"]
    assert len(words) <= chapters[0]["chars"] < len(words) + 20, chapters[0]["chars"]


def test_only_files_that_are_inflated_count_against_epub_max_bytes(live: LiveServer) -> None:
    """Media is never inflated: 40 MB of pictures pass a 32 MB budget; 40 MB of anything that
    would be read does not."""
    pictures = epub(b"<p>Words with pictures.</p>", {"a.png": ("image/png", 20 << 20),
                                                      "b.jpg": ("image/jpeg", 20 << 20)})
    answer, *_ = send(live, pictures)
    assert answer.status_code == 202, answer.text[:300]
    answer, *_ = send(live, epub(b"<p>Words.</p>", {"notes.bin": ("text/plain", 40 << 20)}))
    over_budget(answer, "VOXMUX_EPUB_MAX_BYTES")


# -- Markdown and text ---------------------------------------------------------------------------

def test_a_long_markdown_list_is_parsed_in_slices_and_stops_at_the_text_budget(
        live: LiveServer) -> None:
    """1 MB of list items cost 560 MB, 32 s and a 1.1 s stall of `/health` parsed whole."""
    answer, took, growth, loop = send(live, {"model": "espeak", "input": "- a\n" * 262_144,
                                             "input_format": "markdown"})
    assert growth < GROWTH_MB, f"the server grew by {growth:.0f} MB"
    assert took < 15, took
    assert loop < LOOP_S, f"/health took {loop:.2f} s"
    over_budget(answer, "VOXMUX_JOBS_MAX_CHARS")


def test_text_over_the_budget_is_refused_before_it_is_tidied(live: LiveServer) -> None:
    """20 MB of text: refused by its length, never split into four million words."""
    answer, took, growth, loop = send(live, {"model": "espeak", "input": "word " * 4_000_000})
    assert growth < GROWTH_MB, f"the server grew by {growth:.0f} MB"
    assert took < 5, took
    assert loop < LOOP_S, f"/health took {loop:.2f} s"
    over_budget(answer, "VOXMUX_JOBS_MAX_CHARS")


MARKDOWN = ("Before any heading.\n\n# One\n\nIntro *line*\nstill intro.\n\n"
            "```\n# not a heading\n\n\ncode goes on\n```\n\n- item a\n- item b\n\n"
            "## Sub heading\n\n> quoted\n> more\n\n# Two\n\nLast [link](http://x) text.\n")


@pytest.mark.parametrize("slice_chars", [16, 40, 100_000])
def test_markdown_read_in_slices_reads_as_one_parse(slice_chars: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices cut at blank lines, never inside a code fence: however small they are, the
    chapters are those one parse of the whole text gives (the cut falls between blocks)."""
    whole = book.chapters(MARKDOWN, "markdown", max_chars=MAX_CHARS,
                          budget=book.ArchiveBudget(1, 1))
    monkeypatch.setattr(book, "MARKDOWN_SLICE_CHARS", slice_chars)
    sliced = book.chapters(MARKDOWN, "markdown", max_chars=MAX_CHARS,
                           budget=book.ArchiveBudget(1, 1))
    assert sliced == whole
    assert [c.title for c in whole] == ["", "One", "Two"]
    assert "# not a heading" in whole[1].text and "Sub heading" in whole[1].text


# -- items ---------------------------------------------------------------------------------------

def test_items_past_the_cap_are_refused_before_any_is_validated(live: LiveServer) -> None:
    """330,000 empty items (1 MB) held the event loop 3.65 s while each was validated and its
    error listed; counted first, they are refused in a worker thread."""
    answer, took, _, loop = send(live, {"model": "espeak", "items": [{}] * 330_000})
    assert loop < LOOP_S, f"/health took {loop:.2f} s"
    assert took < 5, took
    over_budget(answer, "VOXMUX_BATCH_MAX_JOB_ITEMS")
    assert answer.json()["error"]["param"] == "items"


@pytest.mark.parametrize("count", [MAX_ITEMS, MAX_ITEMS + 1])
def test_a_jobs_items_are_capped_by_batch_max_job_items(live: LiveServer, count: int) -> None:
    items = [{"input": "Hello there.", "voice": {"id": "en-us"}, "title": f"n{n}"}
             for n in range(count)]
    answer, *_ = send(live, {"model": "espeak", "items": items, "response_format": "wav"})
    if count > MAX_ITEMS:
        over_budget(answer, "VOXMUX_BATCH_MAX_JOB_ITEMS")
    else:
        assert answer.status_code == 202, answer.text[:300]
        assert answer.headers["location"] == f"/v1/audio/jobs/{answer.json()['id']}"
        assert answer.json()["progress"]["total"] >= MAX_ITEMS


def test_a_dense_json_body_is_refused_before_it_is_parsed(live: LiveServer) -> None:
    """Fifteen million numbers in one field (30 MB) are as many objects once parsed: the body's
    values are counted first, from its bytes."""
    raw = b'{"model": "espeak", "input": "x", "speed": [' + b"0," * 15_000_000 + b"0]}"
    answer, took, growth, loop = send(live, raw)
    assert loop < LOOP_S, f"/health took {loop:.2f} s"
    assert took < 5, took
    assert growth < GROWTH_MB, f"the server grew by {growth:.0f} MB"
    over_budget(answer, "VOXMUX_BATCH_MAX_JOB_ITEMS")


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": "espeak", "items": [{}]}, "items.0.input", "missing"),
    ({"model": "espeak", "input": "x", "speed": 9}, "speed", "less_than_equal"),
    ({"model": "espeak", "input": "x", "colour": "red"}, "colour", "extra_forbidden"),
    (b'{"model": "espeak", "input": ', None, "json_invalid"),
    ({"model": "espeak", "items": []}, "items", "too_short"),
])
def test_an_invalid_job_request_is_the_same_400(live: LiveServer, body: dict[str, Any] | bytes,
                                                param: str | None, code: str) -> None:
    """Validated in a thread, a job request's errors are those the other routes answer."""
    answer, *_ = send(live, body)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", param, code), error


def test_the_job_request_body_is_declared_in_the_schema(live: LiveServer) -> None:
    with live.client() as client:
        spec = client.get("/openapi.json").json()
    body = spec["paths"]["/v1/audio/jobs"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert body["required"] is True
    assert "#/$defs/" not in json.dumps(schema)  # every reference resolves in the document
    assert {"model", "input", "items", "input_format"} <= set(schema["properties"])
    items = schema["properties"]["items"]["anyOf"][0]
    assert "input" in items["items"]["properties"]
