"""Text front ends: language detection per run of script, then each language's normalization.

Engines call `prepare` (runs of normalized text, each with its language) and phonemize or speak
each run their own way; `espeak_runs` does the eSpeak-specific part for engines that hand text or
phonemes to eSpeak NG.
"""

from __future__ import annotations

from collections.abc import Callable

from engines.frontend import en, ja, zh
from engines.frontend.detect import Run, base_language, canonical, split_runs
from engines.frontend.espeak_voices import espeak_language

__all__ = ["Run", "base_language", "canonical", "espeak_runs", "normalize", "prepare",
           "supported"]

NORMALIZERS: dict[str, Callable[[str], str]] = {
    "en": en.normalize, "zh": zh.normalize, "ja": ja.normalize,
}
"""Languages with a text normalizer; others go to the phonemizer as written (eSpeak NG reads
numbers in its own languages)."""


def normalize(text: str, language: str) -> str:
    normalizer = NORMALIZERS.get(base_language(language))
    return normalizer(text) if normalizer else text


def prepare(text: str, *, default: str, override: str | None = None) -> list[Run]:
    """`text` cut into runs of one language, each normalized for its language.

    `default` is the voice's language (it reads Latin text when it is written in Latin);
    `override` is the request's `language`.
    """
    runs: list[Run] = []
    for run in split_runs(text, default, override):
        spoken = normalize(run.text, run.language)
        # A rule may leave letters of another script behind (a unit with no local word): those
        # are detected again, with the run's own language claiming its scripts.
        for piece in split_runs(spoken, run.language, run.language):
            if runs and runs[-1].language == piece.language:
                runs[-1] = Run(runs[-1].text + piece.text, piece.language)
            else:
                runs.append(piece)
    return runs


def supported(language: str) -> bool:
    """Whether a request `language` has a front end or an eSpeak NG voice."""
    return base_language(language) in NORMALIZERS or espeak_language(language) is not None


def espeak_runs(text: str, *, voice_language: str, override: str | None = None
                ) -> list[tuple[str, str]]:
    """(text, eSpeak language) pairs: runs in the voice's language keep the voice's language,
    others get eSpeak's voice for theirs; Japanese is handed over as its kana reading."""
    voice_base = base_language(voice_language)
    pairs: list[tuple[str, str]] = []
    for run in prepare(text, default=voice_language, override=override):
        base = base_language(run.language)
        language = voice_language if base == voice_base else (
            espeak_language(run.language) or voice_language)
        spoken = ja.kana(run.text) if base == "ja" else run.text
        if any(c.isalnum() for c in spoken):
            pairs.append((spoken, language))
    return pairs
