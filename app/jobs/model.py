"""What a job is: its items (a book's chapters, or a batch's requests), their segments, its state.

A job is made of items, each spoken with its own options into its own audio: a book's chapters
share the job's model, voice and format; a batch's items each carry their own. An item is cut into
segments when the job is made, and the cut is stored with it: a resumed job renders exactly the
segments it planned, whatever the settings say by then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from engines.base import VoxMuxError

JobStatus = Literal["queued", "running", "done", "failed", "cancelled"]
JobKind = Literal["book", "batch"]
FINISHED: tuple[JobStatus, ...] = ("done", "failed", "cancelled")
BOOK_FORMAT = "m4b"
"""A job's `response_format` that makes the whole job one audiobook file (its chapters: AAC)."""


class JobNotFound(VoxMuxError):
    """No job with that id belongs to the caller."""


class JobNotReady(VoxMuxError):
    """The job (or the chapter asked for) has not finished yet."""


class StoreUnavailable(VoxMuxError):
    """The job store could not be opened at start (its data dir is not writable)."""


class DiskFull(VoxMuxError):
    """The job store's disk bound (or the disk itself) has no room for the next segment."""


@dataclass(frozen=True)
class ItemOptions:
    """How one item is spoken, as the speech service takes it."""

    model: str
    voice: str | None = None
    speed: float = 1.0
    language: str | None = None
    instructions: str | None = None
    response_format: str = "mp3"
    input_format: str | None = None
    """`ssml`, `text`, or None: SSML when the text starts with `<speak>`."""

    def plan_fields(self) -> dict[str, Any]:
        return {"model": self.model, "voice": self.voice, "speed": self.speed,
                "language": self.language, "instructions": self.instructions}


@dataclass
class Item:
    index: int
    title: str
    text: str
    options: ItemOptions
    asked: dict[str, Any] = field(default_factory=dict)
    """The item as the client sent it (a batch manifest repeats its model and voice)."""
    error: dict[str, Any] | None = None
    """OpenAI's error body, for an item that could not be spoken (a batch goes on without it)."""
    sample_rate: int | None = None
    reading: dict[str, Any] | None = None
    """What SSML or a lexicon made of its text, as planned (`CutRecord.reading`); None: the
    text is read as written."""


@dataclass(frozen=True)
class Segment:
    seq: int
    """Position in the whole job."""
    item: int
    part: int
    """Position in its item's plan."""
    text: str
    offset: int
    """Where `text` starts in its item's text."""
    samples: int | None = None
    """Samples stored once rendered (the pause before it included); None until then."""
    how: dict[str, Any] | None = None
    """What it is read with beyond the item's own (`CutRecord.hows`): a break after it, a
    tempo, a pitch, another voice."""


@dataclass(frozen=True)
class ItemSummary:
    """One item as a job's card shows it, read without its text or its segments: what it is,
    and the counts its store keeps as its segments are stored. (What the client asked for it
    is left out: that repeats the text.)"""

    index: int
    title: str
    chars: int
    options: ItemOptions
    error: dict[str, Any] | None
    sample_rate: int | None
    segments: int
    done: int
    """Segments stored."""
    samples: int
    """Samples stored, all its segments together."""

    @property
    def ready(self) -> bool:
        return self.error is None and 0 < self.segments == self.done

    @property
    def seconds(self) -> float | None:
        return self.samples / self.sample_rate if self.ready and self.sample_rate else None


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    audio_seconds: float
    eta_seconds: float | None

    def json(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total,
                "audio_seconds": round(self.audio_seconds, 3),
                "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds, 1)}


@dataclass
class Job:
    id: str
    owner: str
    kind: JobKind
    status: JobStatus
    created: float
    updated: float
    request: dict[str, Any]
    finished: float | None = None
    error: dict[str, Any] | None = None
    bytes: int = 0

    @property
    def ended(self) -> bool:
        return self.status in FINISHED
