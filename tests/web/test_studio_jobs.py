"""The Studio's Jobs panel: start a book from the text box or a file, watch its progress bar,
play and download each chapter, cancel. Over plain HTTP (htmx's requests) and in Chromium."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import BrowserContext, expect

from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.web.browser import needs_chromium, open_studio

HX = {"HX-Request": "true"}
BOOK = "# The Hill\n\nA path went up the hill.\n\n# The Lake\n\nBelow it lay a still lake.\n"
KEY = "studio-jobs-key"


@pytest.fixture(scope="module")
def studio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("studio-jobs"),
                                      preload=["espeak"]))
    yield live
    live.stop()


def settled(client: httpx.Client) -> str:
    """The jobs fragment once htmx would stop polling it (286: no job queued or running)."""
    deadline = time.monotonic() + 60
    while True:
        fragment = client.get("/studio/fragments/jobs")
        if fragment.status_code == 286 or time.monotonic() > deadline:
            return fragment.text
        assert fragment.status_code == 200
        time.sleep(0.1)


def test_a_book_from_the_text_box_gets_chapters_to_play(studio: LiveServer) -> None:
    with studio.client(headers=HX) as client:
        started = client.post("/studio/jobs", data={
            "model": "espeak", "text": BOOK, "input_format": "markdown", "title": "Walk",
            "format": "wav"})
        assert started.status_code == 200 and "Started job_" in started.text
        html = settled(client)
        assert 'data-status="done"' in html and ">Walk<" in html
        assert re.search(r'<progress value="(\d+)" max="\1"', html)
        titles = re.findall(r'<span class="chapter-title">([^<]+)</span>', html)
        assert titles[:2] == ["The Hill", "The Lake"]
        audio = re.findall(r'<audio id="[^"]+" hx-preserve controls preload="none" src="([^"]+)"',
                           html)
        assert len(audio) == 2
        clip = decode(client.get(audio[1]).content, "wav")
        assert clip.duration > 1 and clip.rms > 0.01
        assert "/zip" in html and "/captions?format=srt" in html


def test_an_uploaded_epub_is_read_by_chapter(studio: LiveServer) -> None:
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier("studio-upload")
    book.set_title("Upload")
    book.set_language("en")
    chapter = epub.EpubHtml(title="Only", file_name="c.xhtml", lang="en")
    chapter.content = "<h1>The Only Chapter</h1><p>Short and sweet.</p>"
    book.add_item(chapter)
    book.spine = [chapter]
    book.add_item(epub.EpubNcx())
    buffer = io.BytesIO()
    epub.write_epub(buffer, book)
    with studio.client(headers=HX) as client:
        started = client.post("/studio/jobs", data={"model": "espeak"},
                              files={"file": ("upload.epub", buffer.getvalue())})
        assert started.status_code == 200, started.text
        html = settled(client)
        assert "The Only Chapter" in html and ">upload.epub<" in html


def test_a_bad_job_says_why_and_cancel_stops_one(studio: LiveServer) -> None:
    with studio.client(headers=HX) as client:
        bad = client.post("/studio/jobs", data={"model": "espeak", "voice": "nobody",
                                                "text": "Hello."})
        assert bad.status_code == 400 and "nobody" in bad.text
        client.post("/studio/jobs", data={"model": "espeak", "text": "On and on. " * 20000})
        listed = client.get("/studio/fragments/jobs").text
        job = re.findall(r'data-job="(job_[0-9a-f]+)"', listed)[0]
        cancelled = client.post(f"/studio/jobs/{job}/cancel")
        assert cancelled.status_code == 200
        assert f'data-job="{job}" data-status="cancelled"' in settled(client)


def test_studio_jobs_need_a_session_under_scope_all(tmp_path_factory: pytest.TempPathFactory
                                                    ) -> None:
    live = start_server(test_settings(tmp_path_factory.mktemp("studio-jobs-keyed"),
                                      preload=["espeak"], api_keys=[KEY], auth_scope="all"))
    try:
        with live.client(headers={**HX, "Origin": live.url}) as client:
            refused = client.post("/studio/jobs", data={"model": "espeak", "text": "Hi."})
            assert refused.status_code == 401 and "Sign in" in refused.text
            client.post("/v1/auth/session", json={"key": KEY})
            assert client.post("/studio/jobs", data={"model": "espeak",
                                                     "text": "Hi."}).status_code == 200
            mine = re.findall(r'data-job="(job_[0-9a-f]+)"', settled(client))
            assert len(mine) == 1
            # the session's jobs are its own: the key over the API does not list them
            keyed = httpx.get(live.url + "/v1/audio/jobs",
                              headers={"Authorization": f"Bearer {KEY}"}).json()["data"]
            assert keyed == []
    finally:
        live.stop()


@needs_chromium
def test_the_jobs_panel_in_a_browser(studio: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, studio.url)
    page.fill("#job-title", "Browser book")
    page.select_option("#job-model", "espeak")
    page.fill("#job-text", BOOK)
    page.select_option("#job-input-format", "markdown")
    page.click("#job-start")
    job = page.locator("li.job", has_text="Browser book")
    expect(job).to_have_attribute("data-status", "done")
    expect(job.locator("progress")).to_have_attribute("value", re.compile(r"[1-9]"))
    player = job.locator("audio").first
    duration = player.evaluate("""audio => new Promise((resolve, reject) => {
        const done = () => resolve(audio.duration);
        if (audio.readyState >= 1) return done();
        audio.addEventListener('loadedmetadata', done, {once: true});
        audio.addEventListener('error', () => reject(new Error('audio error')), {once: true});
        audio.load();
    })""")
    assert duration > 1
    expect(job.get_by_role("link", name="ZIP")).to_be_visible()
