"""The pronunciation corpus: 50 hard cases read by the front end every engine reads English
through, each as a careful reader would (the bench has the engines say them, Whisper hear them)."""

from __future__ import annotations

import pytest

from bench.pronunciation import corpus, reading, table

KNOWN = {"It uses 40 W of power."}
"""Cases the front end still reads otherwise (a lone `W` could be a watt or a letter)."""


def test_the_corpus_has_fifty_cases_of_every_kind() -> None:
    rows = corpus()
    assert len(rows) >= 50
    assert {"units", "ranges", "dates", "abbreviations", "names", "mixed"} <= {
        c for c, _, _ in rows}


@pytest.mark.parametrize(("category", "text", "expected"), corpus(),
                         ids=[text for _, text, _ in corpus()])
def test_each_case_is_read_as_expected(category: str, text: str, expected: str) -> None:
    if text in KNOWN:
        assert reading(text) != expected  # when it is fixed, drop it from KNOWN
    else:
        assert reading(text) == expected


def test_the_table_marks_what_differs() -> None:
    rows = [{"category": "units", "input": "40 W", "expected": "forty watts",
             "reads": "forty W", "as_expected": False, "kokoro": {"wer": 0.5},
             "piper": None, "espeak": {"wer": 0.0}}]
    text = table(rows)
    assert "| no (expected: forty watts) | 0.50 | n/a | 0.00 |" in text
