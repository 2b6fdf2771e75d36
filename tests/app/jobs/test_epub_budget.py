"""An EPUB costs what its ZIP directory says it inflates to, checked before anything is inflated:
a bomb (1.5 GB of zeros deflated to 1.5 MB, listed in the manifest but never read) is refused
at once with the server's memory unchanged, and so is an EPUB of too many files; what a book's
text never needs (an image) is never inflated at all, so a damaged picture spoils nothing."""

from __future__ import annotations

import base64
import io
import threading
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from tests.app.jobs.conftest import wait_job
from tests.conftest import LiveServer, start_server, test_settings

MAX_ENTRIES = 20
CONTAINER = ('<?xml version="1.0"?><container version="1.0" '
             'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
             '<rootfile full-path="OEBPS/content.opf" '
             'media-type="application/oebps-package+xml"/></rootfiles></container>')
CHAPTER = ('<html xmlns="http://www.w3.org/1999/xhtml"><body><h1>First Light</h1>'
           '<p>Morning came over the hills.</p><img src="pic.png"/></body></html>')
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGA"
                       "WjR9awAAAABJRU5ErkJggg==")


def opf(extra: dict[str, str]) -> str:
    """A package with one chapter in its spine and `extra` (href: media type) in its
    manifest."""
    items = "".join(f'<item id="x{n}" href="{href}" media-type="{kind}"/>'
                    for n, (href, kind) in enumerate(extra.items()))
    return ('<?xml version="1.0" encoding="utf-8"?><package xmlns="http://www.idpf.org/2007/opf" '
            'version="3.0" unique-identifier="id"><metadata '
            'xmlns:dc="http://purl.org/dc/elements/1.1/">'
            '<dc:identifier id="id">voxmux</dc:identifier>'
            '<dc:title>A small book</dc:title><dc:language>en</dc:language></metadata><manifest>'
            '<item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/>'
            f'{items}</manifest><spine><itemref idref="c1"/></spine></package>')


def epub(extra: dict[str, str], files: dict[str, bytes] | None = None,
         zeros: int = 0) -> bytes:
    """A one-chapter EPUB; `files` are added under OEBPS/, `zeros` bytes of zeros as
    OEBPS/zeros.bin, deflated and written piece by piece (never whole in memory)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mimetype", "application/epub+zip", zipfile.ZIP_STORED)
        archive.writestr("META-INF/container.xml", CONTAINER)
        archive.writestr("OEBPS/content.opf", opf(extra))
        archive.writestr("OEBPS/c1.xhtml", CHAPTER)
        for name, data in (files or {}).items():
            archive.writestr(f"OEBPS/{name}", data, zipfile.ZIP_STORED)
        if zeros:
            chunk = bytes(1024 * 1024)
            with archive.open("OEBPS/zeros.bin", "w", force_zip64=True) as handle:
                for _ in range(zeros // len(chunk)):
                    handle.write(chunk)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("epub")
    server = start_server(test_settings(tmp, preload=["espeak"], idle_ttl=-1,
                                        data_dir=tmp / "data", epub_max_entries=MAX_ENTRIES))
    yield server
    server.stop()


def post(live: LiveServer, data: bytes) -> Any:
    with live.client() as client:
        return client.post("/v1/audio/jobs", json={
            "model": "espeak", "voice": "en-us", "input_format": "epub",
            "input": base64.b64encode(data).decode(), "response_format": "wav"})


class PeakRss:
    """This process's (the in-process server's) resident memory, sampled every 5 ms."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.start = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / 1e6


def test_an_epub_bomb_is_refused_from_its_directory_before_anything_inflates(
        live: LiveServer) -> None:
    bomb = epub({"zeros.bin": "application/octet-stream"}, zeros=1536 * 1024 * 1024)
    assert len(bomb) < 4 * 1024 * 1024  # 1.5 GB of zeros in about 1.5 MB
    started = time.monotonic()
    with PeakRss() as rss:
        answer = post(live, bomb)
    took = time.monotonic() - started
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "over_budget"
    assert error["param"] == "input"
    assert "VOXMUX_EPUB_MAX_BYTES" in error["message"], error
    assert took < 5, took
    assert rss.growth_mb < 100, f"the server grew by {rss.growth_mb:.0f} MB"


def test_an_epub_of_too_many_files_is_refused(live: LiveServer) -> None:
    files = {f"note{n}.txt": b"x" for n in range(MAX_ENTRIES)}
    answer = post(live, epub({}, files))
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "over_budget" and "VOXMUX_EPUB_MAX_ENTRIES" in error["message"]
    fits = post(live, epub({}, dict(list(files.items())[:MAX_ENTRIES - 5])))
    assert fits.status_code == 202, fits.text[:300]


@pytest.mark.parametrize("damaged", [False, True], ids=["image", "damaged-image"])
def test_an_epub_with_an_image_is_read_and_its_image_never_inflated(
        live: LiveServer, damaged: bool) -> None:
    data = bytearray(epub({"pic.png": "image/png"}, {"pic.png": PNG}))
    if damaged:  # a picture whose bytes no longer match its CRC: reading it would fail
        at = data.index(PNG) + 20
        data[at] ^= 0xFF
    answer = post(live, bytes(data))
    assert answer.status_code == 202, answer.text[:300]
    with live.client() as client:
        done = wait_job(client, answer.json()["id"])
    assert done["status"] == "done", done
    assert [c["title"] for c in done["chapters"]] == ["First Light"]
