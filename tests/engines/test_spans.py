"""Spans stored compactly: `Spanned.runs()` and back, for texts as the preparation makes them."""

from __future__ import annotations

import random

import pytest

from app.text.lexicon import Entry, Lexicon
from app.text.prepared import prepare
from engines.frontend import en
from engines.frontend.spans import Spanned

SOURCES = [
    "Hello there.",
    "",
    '<speak>Hello <break time="1s"/> <say-as interpret-as="digits">123</say-as> world '
    '&amp; <sub alias="World Wide Web Consortium">W3C</sub> and GIF.</speak>',
    "The GIF, a gif and [gif](/dʒɪf/) cost $4.50 on 2024-03-05 at 10:30. " * 20,
]


@pytest.mark.parametrize("source", SOURCES)
def test_runs_give_back_every_span(source: str) -> None:
    spoken = prepare(source, lexicon=Lexicon([Entry("gif", "jiff")])).compiled.spoken
    spoken = en.normalize_spanned(spoken)
    runs = spoken.runs()
    assert Spanned.from_runs(spoken.text, runs) == spoken
    assert len(runs) <= max(1, len(spoken.text))


def test_random_spans_survive_and_a_plain_text_is_one_run() -> None:
    rng = random.Random(3)
    for _ in range(200):
        starts = tuple(rng.randint(0, 9) for _ in range(rng.randint(0, 12)))
        spanned = Spanned("x" * len(starts), starts, tuple(s + rng.randint(0, 2) for s in starts))
        assert Spanned.from_runs(spanned.text, spanned.runs()) == spanned
    assert Spanned.of("a whole book " * 1000, 7).runs() == [(13_000, 7, 8, 1)]
    with pytest.raises(ValueError, match="spans for"):
        Spanned.from_runs("abc", [(2, 0, 1, 1)])
