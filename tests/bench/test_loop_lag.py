"""The loop-lag benchmark's pieces that need no server: its figures, its EPUB bomb, its table."""

from __future__ import annotations

import io
import zipfile

from ebooklib import ITEM_DOCUMENT, epub

from bench import loop_lag
from bench.loop_lag import epub_bomb, growth, lag, summary, text_of


def test_a_window_counts_every_poll_overlapping_it() -> None:
    samples = [(0.0, 0.004, 200), (1.0, 0.002, 200), (1.9, 0.5, 200),  # the last ends at 2.4
               (2.5, 0.010, 200), (3.0, 0.2, 0), (9.0, 0.003, 200)]
    window = lag(samples, 2.0, 3.5)
    assert window["polls"] == 3  # the stall that began before the window counts in it
    assert window["failed"] == 1
    assert window["worst_ms"] == 500.0
    assert window["p50_ms"] == 200.0
    assert window["under_target"] is False
    quiet = lag(samples, 0.0, 1.5)
    assert (quiet["polls"], quiet["worst_ms"], quiet["under_target"]) == (2, 4.0, True)
    assert lag(samples, 5.0, 6.0)["polls"] == 0


def test_rss_growth_is_the_peak_over_before_and_none_after_a_death() -> None:
    kept = growth(200_000_000, 350_000_000, 210_000_000, alive=True)
    assert (kept["growth_peak_mb"], kept["growth_after_mb"], kept["under_target"]) == (
        150.0, 10.0, False)
    died = growth(200_000_000, 250_000_000, 0, alive=False)
    assert (died["after_mb"], died["growth_after_mb"], died["under_target"]) == (None, None, True)


def test_the_epub_bomb_is_a_one_chapter_book_whose_directory_states_the_zeros() -> None:
    zeros = 20_000_000
    data = epub_bomb(zeros, chunk=1 << 20)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        first = archive.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
        item = archive.getinfo(loop_lag.ZEROS_NAME)
        assert item.file_size == zeros
        assert item.compress_size < zeros // 500
    assert len(data) < zeros // 500
    book = epub.read_epub(io.BytesIO(data), options={"ignore_ncx": True})
    documents = [book.get_item_with_id(idref) for idref, _ in book.spine]
    assert [d.get_type() for d in documents] == [ITEM_DOCUMENT]
    assert "zeros.bin" in {item.get_name().rsplit("/", 1)[-1] for item in book.get_items()}


def test_text_is_about_as_long_as_asked() -> None:
    assert 10_000 <= len(text_of(10_000)) < 10_100


def test_the_table_renders_failures_and_a_dead_server() -> None:
    lagged = lag([(0.0, 0.25, 200)], 0.0, 1.0)
    result = {
        "machine": {"cpu_model": "cpu", "cpus": 2, "date": "2026-12-07"},
        "code": {"commit": "abc1234", "modified": []}, "quick": True,
        "probe": "a probe", "rss": "RSS", "targets": {"worst_health_ms": 100, "rss_growth_mb": 100},
        "phases": {"no load": {"other_work": {"others": 0.1}}},
        "loads": [{"load": "no load", **lagged, "note": "n"},
                  {"load": "wyoming", "error": "RuntimeError: no"}],
        "bombs": [{"bomb": "epub", "status": None, "seconds": 3.0, "bytes": 0,
                   "rss": growth(100, 5_000_000_000, 0, alive=False)},
                  {"bomb": "breaks", "error": "ServerDied: gone"}],
    }
    table = summary(result)
    assert "| no load | 1 (0) | 250 | 250 | 250 | **no** | n |" in table
    assert "| epub | no answer | 3.0 |" in table
    assert "failed: RuntimeError: no" in table
    assert "server died" in table
    assert "failed: ServerDied: gone" in table


def test_a_refusal_is_counted_by_its_error_code() -> None:
    over = loop_lag.Answer(400, 0.01, body='{"error": {"code": "over_budget", "message": "m"}}')
    assert loop_lag.error_code(over) == "over_budget"
    assert loop_lag.error_code(loop_lag.Answer(None, 0.0, body="ConnectError: refused")) == "None"
    assert loop_lag.error_code(loop_lag.Answer(413, 0.0, body='{"detail": "big"}')) == "413"
