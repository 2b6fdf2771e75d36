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

from engines.base import (
    Audio,
    Capabilities,
    InvalidParameter,
    SynthesisRequest,
    Voice,
    VoiceNotFound,
    concatenate,
)
from engines.espeak_lib import DEFAULT_WPM, espeak
from engines.frontend import espeak_runs, ja, supported


@functools.cache
def _variants() -> frozenset[str]:
    from pathlib import Path

    folder = Path(espeakng_loader.get_data_path()) / "voices" / "!v"
    return frozenset(p.name for p in folder.iterdir() if p.is_file())


NATIVE_SPEED_MIN, NATIVE_SPEED_MAX = 0.5, 2.2


class EspeakEngine:
    name = "espeak"
    sample_rate = 22_050
    capabilities = Capabilities(
        # eSpeak NG keeps to the asked rate from 0.5 to 2.2 times its default (measured within
        # 2%); at its limits (80, 450 wpm) it drifts by 5%: beyond, the time-stretch takes over.
        speed_range=(NATIVE_SPEED_MIN, NATIVE_SPEED_MAX), max_segment_chars=600
    )

    def __init__(self) -> None:
        self._loaded = False

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
        language, plus, variant = req.voice.partition("+")
        runs = espeak_runs(req.text, voice_language=language, override=req.language)
        wpm = round(DEFAULT_WPM * req.speed)
        return concatenate(
            [espeak().synthesize(text, run_language + plus + variant, wpm=wpm, cancel=req.cancel)
             for text, run_language in runs]
        )
