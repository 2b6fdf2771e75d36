"""`write_m4b` on its own: the markers it returns are the ones in the file (read back with
PyAV after mutagen added the cover, which must not lose them), each falls within 50 ms of its
chapter's first sample (a tone of its own per chapter, found in the decoded audio), and the
title, author and cover are there for a player to show."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
from mutagen.mp4 import MP4

from app.audio.audiobook import BookChapter, write_m4b

RATE = 24_000
PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00"
       b"\x00\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xcf\xc0\x00\x00\x03\x01\x01\x00\xc9\xfe"
       b"\x92\xef\x00\x00\x00\x00IEND\xaeB`\x82")


def tone(seconds: float, hz: float) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_markers_title_author_and_cover(tmp_path: Path) -> None:
    lengths = [1.3, 2.2, 0.7]
    chapters = [BookChapter(f"Part {n + 1}", [tone(s / 2, 300 + 200 * n)] * 2)
                for n, s in enumerate(lengths)]
    path = tmp_path / "book.m4b"
    marks = write_m4b(path, chapters, RATE, title="A Title", author="An Author", cover=PNG,
                      pause_seconds=0.5)
    assert [round(m.start, 3) for m in marks] == [0.0, 1.8, 4.5]
    with av.open(str(path)) as container:
        read = container.chapters()
        metadata = dict(container.metadata)
        stream = container.streams.audio[0]
        samples = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    starts = [float(c["start"] * c["time_base"]) for c in read]
    assert np.allclose(starts, [m.start for m in marks], atol=0.05)
    assert [c["metadata"]["title"] for c in read] == ["Part 1", "Part 2", "Part 3"]
    assert metadata["title"] == "A Title" and metadata["artist"] == "An Author"
    for mark, hz in zip(marks, (300, 500, 700), strict=True):
        piece = samples[int((mark.start + 0.05) * RATE):int((mark.start + 0.25) * RATE)]
        peak = np.fft.rfftfreq(len(piece), 1 / RATE)[np.argmax(np.abs(np.fft.rfft(piece)))]
        assert abs(peak - hz) < 10  # this chapter's own tone from its marker on
        silence = samples[int((mark.start - 0.4) * RATE):int((mark.start - 0.05) * RATE)]
        assert mark.start == 0 or np.sqrt(np.mean(silence ** 2)) < 0.01
    tags = MP4(str(path)).tags
    assert tags is not None and bytes(tags["covr"][0]) == PNG
    assert path.read_bytes()[8:12] == b"M4B "
