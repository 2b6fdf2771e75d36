"""What a speech job hands its reader: audio chunks, and around them segment ends and words."""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import Audio, WordTiming

Words = tuple[WordTiming, ...]


@dataclass(frozen=True)
class SegmentEnd:
    """Follows the last audio chunk of one segment in `SpeechJob.events()`."""

    index: int
    text: str
    samples: int
    """Samples of this segment's audio, including the pause before it."""


@dataclass(frozen=True)
class SegmentWords:
    """Comes before the first audio chunk of a segment when the plan asks for timestamps: the
    words of that segment, timed in seconds from the start of the job's audio, with their
    spans in the request text (for streamed text, in the segment's `text`)."""

    index: int
    text: str
    words: Words


JobEvent = Audio | SegmentEnd | SegmentWords
