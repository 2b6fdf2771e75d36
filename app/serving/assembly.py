"""How a job's segments are joined into one stream: pauses between them, words on one clock.

Each rendered segment becomes a `Joined` piece: the pause before it (after a sentence, half of it
after a clause mark, none inside a phrase) is put in front of its first chunk, and its words are
moved onto the job's clock (seconds from the first sample of the whole response). `events()` then
gives what a reader sees for the piece: its words with spans in the request text (when the plan
asks for timestamps), its audio chunks, its `SegmentEnd`. A cached response is replayed as the
same pieces, so a hit and a miss look alike to every protocol.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from app.audio import dsp
from app.serving.cache import CachedAudio
from app.serving.events import JobEvent, SegmentEnd, SegmentWords, Words
from app.serving.plan import SpeechPlan
from app.serving.render import Rendered
from app.text.split import join_kind
from engines.base import Audio, WordTiming

PAUSE_SHARE = {"sentence": 1.0, "clause": 0.5, "word": 0.0}
CHUNK_SECONDS = 2.0
"""Longest audio chunk a reader gets at once."""
"""The share of the sentence pause that follows a segment, by how the segment ends."""


@dataclass(frozen=True)
class Joined:
    """One segment as the reader gets it: the pause before it included."""

    index: int
    text: str
    chunks: tuple[Audio, ...]
    words: Words
    """On the job's clock; spans in `text`."""

    @property
    def samples(self) -> int:
        return sum(len(c) for c in self.chunks)


class Assembly:
    def __init__(self, plan: SpeechPlan, pause_ms: int) -> None:
        self._plan = plan
        self._pause_ms = pause_ms
        self._rate = plan.sample_rate
        self._samples = 0
        """Samples joined so far: where the next piece starts on the job's clock."""
        self._previous: str | None = plan.segments[plan.start - 1] if plan.start else None
        """The segment before the next: a resumed plan's next piece has its pause too."""
        self._previous_index = plan.start - 1

    def reshapes(self, index: int, sample_rate: int) -> bool:
        """Whether joining segment `index` (rendered at `sample_rate`) resamples, stretches or
        shifts its audio: work long enough (half a second for 30 s of audio) to be done off the
        event loop."""
        return (sample_rate != self._rate or self._plan.rates.get(index, 1.0) != 1.0
                or self._plan.pitches.get(index, 1.0) != 1.0)

    def join(self, index: int, text: str, rendered: Rendered, sample_rate: int | None = None
             ) -> Joined:
        """`rendered` at `sample_rate` (another engine's, for a segment an SSML `voice` gives
        it) joined at the plan's own rate."""
        chunks, words = list(rendered.chunks), rendered.words
        if sample_rate is not None and sample_rate != self._rate and chunks:
            chunks = [dsp.resample(np.concatenate(chunks), sample_rate, self._rate)]
        rate = self._plan.rates.get(index, 1.0)
        if rate != 1.0 and chunks:  # SSML prosody rate: this segment at its own tempo
            whole = np.concatenate(chunks)
            stretched = dsp.time_stretch(whole, rate, self._rate)
            scale = len(stretched) / len(whole) if len(whole) else 1.0
            chunks = [stretched]
            words = tuple(w.moved(scale=scale) for w in words)
        pitch = self._plan.pitches.get(index, 1.0)
        if pitch != 1.0 and chunks:  # SSML prosody pitch: the same length, another pitch
            whole = np.concatenate(chunks)
            shifted = dsp.pitch_shift(whole, pitch, self._rate)
            scale = len(shifted) / len(whole) if len(whole) else 1.0
            chunks = [shifted]
            words = tuple(w.moved(scale=scale) for w in words)
        pauses = self._plan.pauses
        if chunks and (self._previous is not None or self._previous_index in pauses):
            # The pause before it; before the first segment only a break (SSML before any text)
            pause = self.pause_after(self._previous or "", self._previous_index)
            if self._previous_index in pauses:  # a break: the silence heard is its length
                head = dsp.voiced_span(chunks[0], self._rate, keep_ms=0)[0]
                pause = pause[:max(0, len(pause) - head)]
            chunks[0] = np.concatenate([pause, chunks[0]])
            words = tuple(w.moved(shift=len(pause) / self._rate) for w in words)
        if chunks and index in pauses:
            # A break follows: this segment's own trailing silence is part of it (cut here, so
            # the join needs nothing of this segment's: a part of a job rendered on its own
            # joins as the whole would); after the text's last segment, the break is here.
            last = chunks[-1]
            chunks[-1] = last[:dsp.voiced_span(last, self._rate, keep_ms=0)[1]]
            if self._plan.ends_item and index == len(self._plan.segments) - 1:
                chunks[-1] = np.concatenate([chunks[-1],
                                             dsp.pause(self._rate, pauses[index] * 1000)])
        if self._plan.timestamps:
            words = tuple(w.moved(shift=self._samples / self._rate) for w in words)
        joined = Joined(index, text, tuple(chunks), words if self._plan.timestamps else ())
        self._samples += joined.samples
        self._previous, self._previous_index = text, index
        return joined

    def pause_after(self, segment: str, index: int = -1) -> Audio:
        """The silence between `segment` and the next. Pauses are part of the tempo: at twice
        the speed they last half as long. An SSML break after the segment replaces the pause:
        the silence heard (the silent edges of both segments included) is the break's length."""
        if index in self._plan.pauses:  # `join` takes the segments' silent edges off
            return dsp.pause(self._rate, self._plan.pauses[index] * 1000)
        share = PAUSE_SHARE[join_kind(segment)]
        return dsp.pause(self._rate, self._pause_ms * share / self._plan.speed)

    def replay(self, entry: CachedAudio) -> Iterator[Joined]:
        """A cached response as the pieces it was stored from."""
        chunks = iter(entry.chunks)
        segments = self._plan.segments
        for index, count in enumerate(entry.segment_chunks):
            text = segments[index] if index < len(segments) else ""
            words = entry.segment_words(index, text) if self._plan.timestamps else ()
            joined = Joined(index, text, tuple(next(chunks) for _ in range(count)), words)
            self._samples += joined.samples
            yield joined

    def events(self, joined: Joined) -> Iterator[JobEvent]:
        """What a reader gets of a piece; its audio in chunks of at most `CHUNK_SECONDS` (a
        slow segment can be minutes long, and each chunk is encoded and framed at once)."""
        if self._plan.timestamps:
            yield SegmentWords(joined.index, joined.text, self._placed(joined))
        most = round(CHUNK_SECONDS * self._rate)
        for chunk in joined.chunks:
            for start in range(0, len(chunk), most):
                yield chunk[start:start + most]
        yield SegmentEnd(joined.index, joined.text, joined.samples)

    def _placed(self, joined: Joined) -> Words:
        """Segment-relative spans moved to the request text (streamed text keeps them); when
        SSML or a lexicon made the text the engines read, to the span of what the client sent,
        each word named as the client wrote it."""
        offsets = self._plan.offsets
        index = joined.index
        if index >= len(offsets) or not offsets[index]:
            words = joined.words
        else:
            words = tuple(w.moved(chars=offsets[index]) for w in joined.words)
        if self._plan.prepared is None:
            return words
        merged: list[WordTiming] = []
        for word in map(self._to_source, words):
            last = merged[-1] if merged else None
            if last is not None and (last.char_start, last.char_end) == (
                    word.char_start, word.char_end):  # words of one alias or say-as
                merged[-1] = WordTiming(last.word, last.start, word.end, last.char_start,
                                        last.char_end)
            else:
                merged.append(word)
        return tuple(merged)

    def _to_source(self, word: WordTiming) -> WordTiming:
        start, end = self._plan.source_span(word.char_start, word.char_end)
        written = self._plan.source[start:end]
        times = word.char_times if len(written) == len(word.word) else ()
        return WordTiming(written, word.start, word.end, start, end, times)
