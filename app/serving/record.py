"""The render record: everything that shapes a request's audio, and the cache key made from it.

Two requests with the same record get the same samples, so the record is what the audio cache
is keyed by, in this process and in a shared tier that outlives it: the model and its engine,
the voice as resolved, the tempo (the engine's part and the stretch), the language, each
segment's text (whitespace aside), who reads the segments SSML gives another voice or language
(each with its engine's fingerprint), and a fingerprint of what the audio is made from: the
engine's fingerprint of the voice (weights, voice data, phonemizer versions: a replaced voice
file is another record), the settings that shape the joined audio (the pause between sentences)
and the code's audio revision. A job keeps the record it planned with and stores its result only
if the model still renders that voice the same way when it finishes (`RenderRecord.current`):
audio made before a rescan or a reload is never stored after it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from app.audio.dsp import AUDIO_REVISION
from engines.base import Engine, Fingerprinted
from engines.signature import package_versions

if TYPE_CHECKING:
    from app.serving.plan import Speaker

SpeakerRecord = tuple[int, str, str, float, float, str | None, str]
"""(segment index, model, voice, engine's tempo, stretch, language, engine's fingerprint)."""


def engine_fingerprint(engine: Engine, voice: str) -> str:
    """The engine's own fingerprint of `voice`; its name and class where it has none."""
    if isinstance(engine, Fingerprinted):
        return engine.fingerprint(voice)
    kind = type(engine)
    return f"{engine.name}:{kind.__module__}.{kind.__qualname__}"


@dataclass(frozen=True)
class RenderRecord:
    model: str
    engine: str
    voice: str
    native_speed: float
    stretch: float
    language: str | None
    segments: tuple[str, ...]
    """Each segment's text with its whitespace normalized (a paragraph break is kept as the
    segmentation itself, which changes the pauses)."""
    fingerprint: str
    """The engine's fingerprint of the voice (`engines.signature`)."""
    pause_ms: int
    code: str
    """VoxMux's version and audio revision."""
    pauses: tuple[tuple[int, float], ...] = ()
    """SSML breaks: (segment index, seconds of silence after it)."""
    rates: tuple[tuple[int, float], ...] = ()
    """SSML prosody rates: (segment index, tempo)."""
    pitches: tuple[tuple[int, float], ...] = ()
    """SSML prosody pitches: (segment index, factor)."""
    speakers: tuple[SpeakerRecord, ...] = ()
    """Segments SSML gives another model, voice or language, and who reads them."""

    @classmethod
    def of(cls, *, model: str, engine: Engine, voice: str, native_speed: float, stretch: float,
           language: str | None, segments: list[str] | tuple[str, ...], pause_ms: int,
           pauses: dict[int, float] | None = None, rates: dict[int, float] | None = None,
           pitches: dict[int, float] | None = None,
           speakers: Mapping[int, Speaker] | None = None) -> RenderRecord:
        return cls(
            model=model, engine=engine.name, voice=voice,
            native_speed=float(native_speed), stretch=float(stretch), language=language,
            segments=tuple(" ".join(s.split()) for s in segments),
            fingerprint=engine_fingerprint(engine, voice), pause_ms=pause_ms,
            code=f"{package_versions('voxmux')}/audio{AUDIO_REVISION}",
            pauses=tuple(sorted((pauses or {}).items())),
            rates=tuple(sorted((rates or {}).items())),
            pitches=tuple(sorted((pitches or {}).items())),
            speakers=_speakers(speakers),
        )

    def key(self) -> str:
        """`<model>:<sha256 of the record>`: the model prefix lets a model's entries be dropped
        together."""
        blob = json.dumps(asdict(self), sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))
        return f"{self.model}:{hashlib.sha256(blob.encode()).hexdigest()}"

    def current(self, engine: Engine, speakers: Mapping[int, Speaker] | None = None) -> bool:
        """Whether `engine` still renders this record's voice as it did when it was made (and
        the engines of `speakers` theirs)."""
        return (engine_fingerprint(engine, self.voice) == self.fingerprint
                and _speakers(speakers) == self.speakers)


def _speakers(speakers: Mapping[int, Speaker] | None) -> tuple[SpeakerRecord, ...]:
    return tuple(
        (index, s.handle.id, s.voice, float(s.native_speed), float(s.stretch), s.language,
         engine_fingerprint(s.engine, s.voice))
        for index, s in sorted((speakers or {}).items()))
