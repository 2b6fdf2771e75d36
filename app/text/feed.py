"""Streamed text (LLM tokens) turned into the sentences of one speech job.

A protocol feeds fragments as they arrive; the job takes sentences as they complete, so reading
never waits on synthesis. Pieces with nothing to say ("!", an emoji) wait to join the next
sentence, never dropped unless the stream ends on them; what waits is bounded, however much text
arrives.
"""

from __future__ import annotations

import asyncio
import time

from app.text.split import IncrementalSplitter
from engines.base import VoxMuxError


class TextBacklogFull(VoxMuxError):
    """More text waits to be spoken than the session may hold."""


def _speakable(text: str) -> bool:
    return any(char.isalnum() for char in text)


class TextFeed:
    def __init__(self, *, max_chars: int, first_max_chars: int, max_pending: int) -> None:
        self._splitter = IncrementalSplitter(max_chars=max_chars, first_max_chars=first_max_chars)
        self._sentences: asyncio.Queue[str | None] = asyncio.Queue()
        self._carry = ""
        self._pending = 0
        """Characters queued, not yet taken to be spoken."""
        self.max_pending = max_pending
        self.ended = False
        self.first_text_at: float | None = None
        """`time.perf_counter()` when the first text arrived: the clock of first audio."""

    def feed(self, text: str) -> None:
        if self.ended or not text:
            return
        if self.first_text_at is None:
            self.first_text_at = time.perf_counter()
        for piece in self._splitter.feed(text):
            self._queue(piece)

    def flush(self) -> None:
        """Everything buffered becomes sentences now, complete or not."""
        if not self.ended:
            for piece in self._splitter.flush():
                self._queue(piece)

    def end(self) -> None:
        """Flush, and let the job finish once the last sentence is spoken."""
        if not self.ended:
            self.flush()
            self.ended = True
            self._sentences.put_nowait(None)

    @property
    def ready(self) -> bool:
        """Whether `next()` would return at once (a sentence is waiting, or the end)."""
        return not self._sentences.empty()

    async def next(self) -> str | None:
        """The next sentence to speak; None once the stream has ended."""
        sentence = await self._sentences.get()
        if sentence is None:
            self._sentences.put_nowait(None)  # stays ended for any later call
            return None
        self._pending -= len(sentence)
        return sentence

    def _queue(self, piece: str) -> None:
        """Queue a sentence; one with nothing to say waits to join the next.

        The carried piece keeps at most what fits beside the next sentence in one segment, and
        queued text beyond `max_pending` raises `TextBacklogFull`.
        """
        limit = self._splitter.max_chars
        room = limit - len(piece) - 1
        carry = self._carry[len(self._carry) - room:] if room > 0 else ""
        text = f"{carry} {piece}" if carry else piece
        if not _speakable(text):
            self._carry = text[-limit:]
            return
        self._carry = ""
        self._pending += len(text)
        if self._pending > self.max_pending:
            raise TextBacklogFull(
                f"More than {self.max_pending} characters are waiting to be spoken; send text no "
                "faster than it is spoken"
            )
        self._sentences.put_nowait(text)
