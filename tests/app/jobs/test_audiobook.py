"""A book job with `response_format: m4b` is one audiobook, as players expect it: AAC in MP4, a
chapter marker where each chapter's audio starts (read back with PyAV, within 50 ms of where
the job's own chapter durations and pauses put it, and heard there by Whisper), the book's
title; each chapter alone is AAC, in the ZIP too, and the outputs directory keeps the .m4b."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import av
import numpy as np

from tests.app.jobs.conftest import wait_job
from tests.app.jobs.test_jobs import MARKDOWN, make_job
from tests.conftest import LiveServer, decode
from tests.epubs import make_epub
from tests.hearing import hear


def test_a_book_job_is_one_m4b_with_a_marker_at_each_chapter(espeak_server: LiveServer,
                                                             tmp_path: Path) -> None:
    with espeak_server.client() as client:
        job = make_job(client, input=MARKDOWN, input_format="markdown", response_format="m4b",
                       title="Three chapters")
        done = wait_job(client, str(job["id"]))
        assert done["status"] == "done", done
        chapters = done["chapters"]
        whole = client.get(f"/v1/audio/jobs/{job['id']}/audio")
        assert whole.status_code == 200 and whole.headers["content-type"] == "audio/mp4"
        assert "m4b" in whole.headers["content-disposition"]
        again = client.get(f"/v1/audio/jobs/{job['id']}/audio")  # made once, kept
        assert again.content == whole.content
        second = client.get(chapters[1]["audio"])
        assert second.headers["content-type"] == "audio/aac"
        assert abs(decode(second.content, "aac").duration - chapters[1]["duration_s"]) < 0.1
        archive = zipfile.ZipFile(io.BytesIO(client.get(f"/v1/audio/jobs/{job['id']}/zip")
                                             .content))
        files = [e["file"] for e in json.loads(archive.read("manifest.json"))["items"]]
        assert files == ["001.aac", "002.aac", "003.aac"]
    book = tmp_path / "book.m4b"
    book.write_bytes(whole.content)
    pause = espeak_server.app.state.settings.chapter_pause_ms / 1000
    durations = [c["duration_s"] for c in chapters]
    expected = [sum(durations[:n]) + n * pause for n in range(3)]
    with av.open(str(book)) as container:
        marks = container.chapters()
        assert container.metadata.get("title") == "Three chapters"
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "aac"
        rate = stream.codec_context.sample_rate
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    assert [m["metadata"]["title"] for m in marks] == ["The River", "The Mill", "The Sea"]
    starts = [float(m["start"] * m["time_base"]) for m in marks]
    assert np.allclose(starts, expected, atol=0.05), (starts, expected)
    assert abs(len(samples) / rate - (sum(durations) + 2 * pause)) < 0.2
    for start, word in zip(starts[1:], ("mill", "short"), strict=True):
        before = samples[int((start - pause + 0.2) * rate):int((start - 0.05) * rate)]
        assert np.sqrt(np.mean(before ** 2)) < 0.003  # the pause ends at the marker
        heard = hear(samples[int(start * rate):int((start + 2.5) * rate)], rate)
        assert word in heard.text.lower(), heard.text  # the chapter's first words, at its mark
    outputs = Path(espeak_server.app.state.settings.outputs_dir)
    kept = list(outputs.glob(f"*{job['id']}.m4b"))
    assert len(kept) == 1 and kept[0].read_bytes()[4:8] == b"ftyp"


def epub_with_cover(cover: bytes) -> bytes:
    return make_epub([("Dawn", "<p>The sun rose over the quiet town.</p>"),
                      ("Dusk", "<p>The lamps were lit along the road.</p>")],
                     title="The Covered Book", identifier="voxmux-cover",
                     author="Ada Writer", cover=cover)


def test_an_epub_audiobook_carries_its_title_author_and_cover(espeak_server: LiveServer,
                                                              tmp_path: Path) -> None:
    import base64

    from mutagen.mp4 import MP4

    from tests.app.audio.test_audiobook import PNG

    with espeak_server.client() as client:
        job = make_job(client, input=base64.b64encode(epub_with_cover(PNG)).decode(),
                       input_format="epub", response_format="m4b")
        done = wait_job(client, str(job["id"]))
        assert done["status"] == "done", done
        assert done["title"] == "The Covered Book"
        whole = client.get(f"/v1/audio/jobs/{job['id']}/audio")
    book = tmp_path / "book.m4b"
    book.write_bytes(whole.content)
    with av.open(str(book)) as container:
        assert [c["metadata"]["title"] for c in container.chapters()] == ["Dawn", "Dusk"]
        assert container.metadata.get("artist") == "Ada Writer"
    tags = MP4(str(book)).tags
    assert tags is not None and bytes(tags["covr"][0]) == PNG


def _encrypted(data: bytes, name: str) -> bytes:
    """`data` (a ZIP) with entry `name` marked encrypted in its directory, as zipfile reads."""
    import struct

    patched = bytearray(data)
    at = patched.find(b"PK\x01\x02")
    while at != -1:
        length = struct.unpack_from("<H", patched, at + 28)[0]
        if bytes(patched[at + 46:at + 46 + length]) == name.encode():
            struct.pack_into("<H", patched, at + 8, struct.unpack_from("<H", patched, at + 8)[0]
                             | 1)
        at = patched.find(b"PK\x01\x02", at + 4)
    return bytes(patched)


def test_a_cover_that_cannot_be_read_leaves_the_book_without_one(espeak_server: LiveServer,
                                                                  tmp_path: Path) -> None:
    """An EPUB whose cover entry is encrypted (or packed in a way Python cannot read) is still
    a book: its audiobook has no cover. (It was a 500, whatever the job's format.)"""
    import base64

    from mutagen.mp4 import MP4

    from tests.app.audio.test_audiobook import PNG

    data = epub_with_cover(PNG)
    name = next(n for n in zipfile.ZipFile(io.BytesIO(data)).namelist() if "cover" in n
                and n.endswith(".png"))
    with espeak_server.client() as client:
        job = make_job(client, input=base64.b64encode(_encrypted(data, name)).decode(),
                       input_format="epub", response_format="m4b")
        assert wait_job(client, str(job["id"]))["status"] == "done"
        whole = client.get(f"/v1/audio/jobs/{job['id']}/audio")
    book = tmp_path / "book.m4b"
    book.write_bytes(whole.content)
    tags = MP4(str(book)).tags
    assert tags is None or "covr" not in tags


def test_chapters_at_other_rates_are_resampled_to_the_books(espeak_server: LiveServer,
                                                            tmp_path: Path) -> None:
    """tts-1 speaks English with hibari at 24 kHz and Russian with eSpeak NG at 22.05 kHz: each
    chapter keeps its length and pitch in the book (it was written at the first chapter's rate,
    8.8 % fast), and the markers fall where the chapters' own durations put them."""
    with espeak_server.client() as client:
        job = make_job(client, response_format="m4b", model="tts-1", voice=None, items=[
            {"input": "The first chapter, spoken by hibari.", "title": "One"},
            {"input": "Утро наступило в тихом городе.", "title": "Two"},  # eSpeak NG
            {"input": "The third chapter, hibari again.", "title": "Three"}])
        done = wait_job(client, str(job["id"]))
        assert done["status"] == "done", done
        whole = client.get(f"/v1/audio/jobs/{job['id']}/audio")
    book = tmp_path / "book.m4b"
    book.write_bytes(whole.content)
    pause = espeak_server.app.state.settings.chapter_pause_ms / 1000
    durations = [c["duration_s"] for c in done["chapters"]]
    with av.open(str(book)) as container:
        starts = [float(m["start"] * m["time_base"]) for m in container.chapters()]
        assert container.streams.audio[0].codec_context.sample_rate == 24000
        seconds = float(container.duration or 0) / 1e6
    expected = [sum(durations[:n]) + n * pause for n in range(3)]
    assert np.allclose(starts, expected, atol=0.05), (starts, expected)
    assert abs(seconds - (sum(durations) + 2 * pause)) < 0.2


def test_a_whole_wav_of_chapters_at_other_rates_keeps_their_lengths(
        espeak_server: LiveServer) -> None:
    """Not only the M4B: a job's whole audio in any format carries every chapter at one rate
    (the first's), each resampled to it; it used to be written at the first chapter's rate as
    it was, the eSpeak NG chapter 8.8 % fast and high."""
    with espeak_server.client() as client:
        job = make_job(client, response_format="wav", model="tts-1", voice=None, items=[
            {"input": "The first chapter, spoken by hibari.", "title": "One"},
            {"input": "Утро наступило в тихом городе. Дети пошли в школу.", "title": "Two"}])
        done = wait_job(client, str(job["id"]))
        assert done["status"] == "done", done
        whole = decode(client.get(f"/v1/audio/jobs/{job['id']}/audio").content, "wav")
        second = decode(client.get(f"/v1/audio/jobs/{job['id']}/chapters/2/audio").content,
                        "wav")
    assert (whole.sample_rate, second.sample_rate) == (24000, 22050)
    pause = espeak_server.app.state.settings.chapter_pause_ms / 1000
    durations = [c["duration_s"] for c in done["chapters"]]
    assert abs(whole.duration - (sum(durations) + pause)) < 0.03, (whole.duration, durations)
