"""`app.jobs.book`'s tidying of a chapter's text: the same as its regular expressions over the
whole text, done a piece at a time so that no step holds the interpreter's lock long."""

from __future__ import annotations

import random

import pytest

from app.jobs import book


def _whole(text: str) -> str:
    return book._SPACES.sub(" ", book._PARAGRAPH_BREAK.sub("\n\n", text.strip()))


def test_tidying_in_pieces_is_tidying_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random texts of words, spaces, tabs and runs of newlines, cut into pieces of 1 to 50
    characters: every piece boundary a match could cross or look across is tried."""
    rng = random.Random(3)
    parts = ["word", "Word.", " ", "  ", "\n", "\n\n", " \n \n ", "\t", "\n\n\n", "x", "\u3000"]
    for _ in range(300):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 2000)))
        monkeypatch.setattr(book, "TIDY_PIECE", rng.randint(1, 50))
        assert book._tidy(text) == _whole(text)


def test_a_long_chapter_is_tidied_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two million characters went to one `re.sub` call: 140 ms with the lock held."""
    calls: list[int] = []
    spaces = book._SPACES

    class Counted:
        def sub(self, repl: str, text: str) -> str:
            calls.append(len(text))
            return spaces.sub(repl, text)

    text = "The river ran slowly past the mill.  \n\n\n  " * 50_000
    whole = _whole(text)
    monkeypatch.setattr(book, "_SPACES", Counted())
    assert book._tidy(text) == whole
    assert len(calls) > 10 and max(calls) < 2 * book.TIDY_PIECE
