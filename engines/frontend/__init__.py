"""Text front ends: language detection per run of script, then each language's normalization.

Engines call `prepare` (runs of normalized text, each with its language) and phonemize or speak
each run their own way; `espeak_runs` does the eSpeak-specific part for engines that hand text or
phonemes to eSpeak NG.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engines.frontend import en, ja
from engines.frontend.detect import Run, base_language, canonical, split_runs
from engines.frontend.espeak_voices import espeak_language
from engines.frontend.ipa import INLINE
from engines.frontend.spans import Spanned

IPA = "x-ipa"
"""The language of a run that is a reading in IPA (`[word](/ipa/)`): each engine maps it onto
its own phoneme set (`engines.frontend.ipa`), its characters span the word it reads."""

__all__ = [
    "IPA",
    "Run",
    "Spanned",
    "SpannedRun",
    "base_language",
    "canonical",
    "espeak_runs",
    "espeak_runs_spanned",
    "normalize",
    "prepare",
    "prepare_spanned",
    "supported",
]

def _chinese(text: Spanned) -> Spanned:
    # Imported when first needed: cn2an and pypinyin take 0.35 s, which every process would
    # pay at start (an engine replica replacing a dead one, `voxmux say`) for a text it may
    # never get.
    from engines.frontend import zh

    return zh.normalize_spanned(text)


NORMALIZERS: dict[str, Callable[[Spanned], Spanned]] = {
    "en": en.normalize_spanned, "zh": _chinese, "ja": ja.normalize_spanned,
}
"""Languages with a text normalizer; others go to the phonemizer as written (eSpeak NG reads
numbers in its own languages)."""


@dataclass(frozen=True)
class SpannedRun:
    """A run of one language whose characters know their span in the text it was cut from."""

    text: Spanned
    language: str


def normalize(text: str, language: str) -> str:
    return normalize_spanned(Spanned.of(text), language).text


def normalize_spanned(text: Spanned, language: str) -> Spanned:
    normalizer = NORMALIZERS.get(base_language(language))
    return normalizer(text) if normalizer else text


def prepare(text: str, *, default: str, override: str | None = None) -> list[Run]:
    """`text` cut into runs of one language, each normalized for its language.

    `default` is the voice's language (it reads Latin text when it is written in Latin);
    `override` is the request's `language`.
    """
    return [Run(run.text.text, run.language)
            for run in prepare_spanned(text, default=default, override=override)]


def prepare_spanned(text: str, *, default: str, override: str | None = None
                    ) -> list[SpannedRun]:
    """`prepare`, each run's characters with their span in `text`; a `[word](/ipa/)` is a run
    of its own in `IPA`, spanning `word`."""
    runs: list[SpannedRun] = []
    position = 0
    for match in INLINE.finditer(text):
        _prepare_piece(text[position:match.start()], position, default, override, runs)
        runs.append(SpannedRun(Spanned.made_from(match["ipa"], *match.span("word")), IPA))
        position = match.end()
    _prepare_piece(text[position:], position, default, override, runs)
    return runs


def _prepare_piece(text: str, offset: int, default: str, override: str | None,
                   runs: list[SpannedRun]) -> None:
    for run in split_runs(text, default, override):
        spoken = normalize_spanned(Spanned.of(run.text, offset), run.language)
        offset += len(run.text)
        # A rule may leave letters of another script behind (a unit with no local word): those
        # are detected again, with the run's own language claiming its scripts.
        position = 0
        for piece in split_runs(spoken.text, run.language, run.language):
            part = spoken[position:position + len(piece.text)]
            position += len(piece.text)
            if runs and runs[-1].language == piece.language:
                runs[-1] = SpannedRun(runs[-1].text + part, piece.language)
            else:
                runs.append(SpannedRun(part, piece.language))


def supported(language: str) -> bool:
    """Whether a request `language` has a front end or an eSpeak NG voice."""
    return base_language(language) in NORMALIZERS or espeak_language(language) is not None


def espeak_runs(text: str, *, voice_language: str, override: str | None = None
                ) -> list[tuple[str, str]]:
    """(text, eSpeak language) pairs: runs in the voice's language keep the voice's language,
    others get eSpeak's voice for theirs; Japanese is handed over as its kana reading."""
    return [(spoken.text, language) for spoken, language
            in espeak_runs_spanned(text, voice_language=voice_language, override=override)]


def espeak_runs_spanned(text: str, *, voice_language: str, override: str | None = None
                        ) -> list[tuple[Spanned, str]]:
    """`espeak_runs`, each text with its characters' spans in `text` (a kana reading spans its
    whole run)."""
    voice_base = base_language(voice_language)
    pairs: list[tuple[Spanned, str]] = []
    for run in prepare_spanned(text, default=voice_language, override=override):
        if run.language == IPA:
            pairs.append((run.text, IPA))
            continue
        base = base_language(run.language)
        language = voice_language if base == voice_base else (
            espeak_language(run.language) or voice_language)
        spoken = run.text
        if base == "ja":
            spoken = Spanned.made_from(ja.kana(run.text.text), *run.text.source_span(
                0, len(run.text)))
        if any(c.isalnum() for c in spoken.text):
            pairs.append((spoken, language))
    return pairs
