"""A request checked and ready to run, as `SpeechService.plan` makes it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.serving.budgets import AudioLimit
from app.serving.scheduler import Lane
from app.text.feed import TextFeed
from app.text.prepared import Prepared
from app.text.ssml import Compiled
from engines.base import Engine
from engines.frontend.spans import Spanned
from engines.registry import ModelHandle


@dataclass(frozen=True)
class Speaker:
    """Who reads a run of segments: a model and its voice, the tempo split for its engine, the
    language. A plan's own speaker reads every segment that SSML gives no other."""

    handle: ModelHandle[Lane]
    voice: str
    native_speed: float
    stretch: float
    language: str | None

    @property
    def engine(self) -> Engine:
        return self.handle.engine


@dataclass
class SpeechPlan:
    """Everything that can fail before a byte is sent has been checked."""

    handle: ModelHandle[Lane]
    request_id: str
    voice: str
    text: str | TextFeed
    """The whole text, or the feed a text-in session writes to."""
    segments: list[str]
    """The text cut for the engine; empty for a feed, whose sentences come as they complete."""
    native_speed: float
    stretch: float
    """Pitch-preserving time-stretch applied after the engine (speed beyond its own range)."""
    language: str | None
    warnings: list[str] = field(default_factory=list)
    internal: bool = False
    """A warm-up: no cache, no record, no metrics."""
    timestamps: bool = False
    """Word timings wanted: `SegmentWords` events come before each segment's audio."""
    offsets: list[int] = field(default_factory=list)
    """Where each of `segments` starts in `text` (segments are slices of it)."""
    client: str = ""
    """Who asked (`app.http.clients`): a model's places and turns are shared out by client."""
    start: int = 0
    """The first segment to render: a resumed long-form job has the ones before (`app.jobs`)."""
    background: bool = False
    """A long-form job's: its segments yield the engine to interactive requests."""
    cacheable: bool = True
    """Whether the audio cache may serve or keep the response."""
    prepared: Prepared | None = None
    """SSML compiled and lexicons applied: `text` is then what the engines read, and word spans
    are moved back into the client's text (`prepared.source`)."""
    pauses: dict[int, float] = field(default_factory=dict)
    """Segment index -> seconds of silence after it (an SSML break, replacing the pause)."""
    rates: dict[int, float] = field(default_factory=dict)
    """Segment index -> tempo that segment is read at (SSML `prosody rate`)."""
    pitches: dict[int, float] = field(default_factory=dict)
    """Segment index -> pitch factor that segment is read at (SSML `prosody pitch`)."""
    report: bool = False
    """Whether the client asked for the normalization report."""
    least_seconds: float = 0.0
    """Audio the input makes at least (its SSML breaks, its letters read faster than any voice
    reads them): what budgets are checked against before any audio is made."""
    ends_item: bool = True
    """Whether the last of `segments` ends the text (a part of a long-form item that stops
    before its end: False, and a break after its last segment is the next part's to make)."""
    routed: str | None = None
    """One of OpenAI's model names the request asked for, when it chose this model by the
    text's language (`SpeechService._route`)."""
    asked_voice: str | None = None
    """The voice as a routed request named it (an OpenAI name), for an SSML <lang> stretch
    another model reads."""
    audio_limit: AudioLimit | None = None
    """The most audio the request may make (`app.serving.budgets`); None: no bound of its own
    (a long-form job's part: the job counts its whole)."""
    speakers: dict[int, Speaker] = field(default_factory=dict)
    """Segment index -> another model, voice or language than the plan's own (SSML `voice`,
    `lang`); its audio is brought to the plan's sample rate when joined."""

    @property
    def speaker(self) -> Speaker:
        """The plan's own model, voice, tempo and language."""
        return Speaker(self.handle, self.voice, self.native_speed, self.stretch, self.language)

    def runs(self) -> list[tuple[Speaker, int | None]]:
        """From `start`: each run of segments one speaker reads and the index its run ends
        before (None: until the text ends, a text-in feed's one run)."""
        if self.streamed or not self.speakers:
            return [(self.speaker, None)]
        runs: list[tuple[Speaker, int | None]] = []
        for index in range(self.start, len(self.segments)):
            speaker = self.speakers.get(index, self.speaker)
            if runs and runs[-1][0] == speaker:
                runs[-1] = (speaker, index + 1)
            else:
                runs.append((speaker, index + 1))
        return runs

    @property
    def source(self) -> str:
        """The text as the client sent it."""
        if self.prepared is not None:
            return self.prepared.source
        return self.text if isinstance(self.text, str) else ""

    @property
    def caption_text(self) -> str:
        """The client's text with markup blanked: what captions and alignments quote."""
        if self.prepared is not None:
            return self.prepared.display
        return self.text if isinstance(self.text, str) else ""

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the client's text that `text[start:end]` stands for."""
        if self.prepared is None:
            return start, end
        return self.prepared.source_span(start, end)

    @property
    def model_id(self) -> str:
        return self.handle.id

    @property
    def speed(self) -> float:
        """The tempo asked for: the engine's part times the stretch."""
        return self.native_speed * self.stretch

    @property
    def engine(self) -> Engine:
        return self.handle.engine

    @property
    def sample_rate(self) -> int:
        return self.handle.engine.sample_rate

    @property
    def streamed(self) -> bool:
        return isinstance(self.text, TextFeed)

    def traced(self) -> dict[str, str | int]:
        """What a trace shows of the request (`app.serving.tracing`)."""
        return {"voxmux.model": self.model_id, "voxmux.voice": self.voice,
                "voxmux.characters": len(self.source), "voxmux.segments": len(self.segments),
                "voxmux.client": self.client}


Speakers = Callable[[SpeechPlan, str, str, "str | None"], Speaker]
"""Makes the speaker of a stored segment: (plan, model, voice, language) -> `Speaker`."""


@dataclass(frozen=True)
class CutRecord:
    """What planning a long-form item made, as its job keeps it (JSON-able): where the text was
    cut, what each segment is read with, and the text the engines read when SSML or a lexicon
    made it, with each character's span in the client's text. A part rendered later (resumed,
    or one of several at once) is planned from it (`apply`), never prepared again: lexicons
    and settings may have changed meanwhile."""

    segments: tuple[str, ...]
    offsets: tuple[int, ...]
    hows: tuple[dict[str, Any] | None, ...]
    """Per segment, what is not the plan's own: `pause` (seconds of break after it), `rate`,
    `pitch`, `speaker` ([model, voice, language]); None for most."""
    reading: dict[str, Any] | None = None
    """`{"spoken", "runs", "lead", "ssml"}`: the text the engines read, its spans
    (`Spanned.runs`), seconds of break before the first segment, whether it was SSML; None:
    the item's text is read as written."""

    @classmethod
    def of(cls, plan: SpeechPlan) -> CutRecord:
        hows: list[dict[str, Any] | None] = []
        for index in range(len(plan.segments)):
            how: dict[str, Any] = {}
            for key, values in (("pause", plan.pauses), ("rate", plan.rates),
                                ("pitch", plan.pitches)):
                if index in values:
                    how[key] = values[index]
            if index in plan.speakers:
                speaker = plan.speakers[index]
                how["speaker"] = [speaker.handle.id, speaker.voice, speaker.language]
            hows.append(how or None)
        reading = None
        if plan.prepared is not None:
            spoken = plan.prepared.compiled.spoken
            reading = {"spoken": spoken.text, "runs": spoken.runs(),
                       "lead": plan.pauses.get(-1, 0.0), "ssml": plan.prepared.markup}
        return cls(tuple(plan.segments), tuple(plan.offsets), tuple(hows), reading)

    def apply(self, plan: SpeechPlan, end: int, speaker: Speakers) -> None:
        """`plan` (made for the item's text, voice and speed) given the first `end` segments
        of the record and what they are read with."""
        plan.segments, plan.offsets = list(self.segments[:end]), list(self.offsets[:end])
        plan.ends_item = end == len(self.segments)
        for index, how in enumerate(self.hows[:end]):
            if not how:
                continue
            if "pause" in how:
                plan.pauses[index] = float(how["pause"])
            if "rate" in how:
                plan.rates[index] = float(how["rate"])
            if "pitch" in how:
                plan.pitches[index] = float(how["pitch"])
            if "speaker" in how:
                model, voice, language = how["speaker"]
                plan.speakers[index] = speaker(plan, model, voice, language)
        if self.reading is not None:
            spoken = Spanned.from_runs(self.reading["spoken"],
                                       [tuple(run) for run in self.reading["runs"]])
            source = plan.text if isinstance(plan.text, str) else ""
            plan.prepared = Prepared(source, Compiled(spoken), bool(self.reading.get("ssml")))
            plan.text = spoken.text
            if self.reading.get("lead"):
                plan.pauses[-1] = float(self.reading["lead"])
