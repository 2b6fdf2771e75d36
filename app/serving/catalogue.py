"""The model catalogue (`config/models.toml`): ids, engines, aliases, OpenAI voice names, and
the operator's voice aliases.

It is read once at start into `ModelEntry`s; the registry then owns them (one handle per model)
and resolves names and aliases. `[voice_aliases]` maps voice names other servers' clients send
(HayaKoe's `tsukuyomi`, AngeVoice's `zm_010`) to a voice id or an OpenAI voice name; it is folded
into every model's voice map, an OpenAI name going through that model's own mapping.
`[elevenlabs_voices]` maps ElevenLabs' premade voice ids (what its SDKs' examples and apps send)
to a VoxMux voice (`model:voice`) and the name ElevenLabs gives it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engines.registry import ModelEntry

CREATED = 1_764_633_600  # 2025-12-02, reported as `created` for every local model


@dataclass(frozen=True)
class ElevenLabsVoice:
    name: str
    """ElevenLabs' name for it (`Sarah`)."""
    voice: str
    """The VoxMux voice that speaks it: `model:voice`."""


@dataclass(frozen=True)
class LanguageModels:
    """OpenAI's model names, which speak the language they are given: the model for each
    language (`*`: any other)."""

    names: tuple[str, ...]
    models: dict[str, str]

    def model_for(self, language: str) -> str:
        base = language.split("-")[0].lower()
        return self.models.get(base) or self.models["*"]

    @property
    def english(self) -> str:
        return self.models.get("en") or self.models["*"]


@dataclass(frozen=True)
class Catalogue:
    models: dict[str, ModelEntry]
    voice_aliases: dict[str, str] = field(default_factory=dict)
    elevenlabs_voices: dict[str, ElevenLabsVoice] = field(default_factory=dict)
    languages: LanguageModels | None = None
    """`[openai] models` and `[openai.languages]`; None when the catalogue has no such table
    (then OpenAI's names are whatever aliases say)."""

    @classmethod
    def load(cls, path: Path) -> Catalogue:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        aliases = {str(k): str(v) for k, v in data.get("voice_aliases", {}).items()}
        languages = _languages(data.get("openai", {}), set(data["models"]))
        models = {
            model_id: ModelEntry(
                id=model_id,
                engine=entry["engine"],
                description=entry.get("description", ""),
                default_voice=entry["default_voice"],
                aliases=tuple(entry.get("aliases", ())) + (
                    languages.names
                    if languages is not None and model_id == languages.english else ()),
                voice_map=_voice_map(dict(entry.get("voices", {})), aliases),
            )
            for model_id, entry in data["models"].items()
        }
        return cls(models, aliases, _elevenlabs(data.get("elevenlabs_voices", {}), models),
                   languages)


def _languages(openai: dict[str, object], models: set[str]) -> LanguageModels | None:
    """`[openai] models` and `[openai.languages]`, each language's model checked to exist."""
    names, table = openai.get("models"), openai.get("languages")
    if not isinstance(names, list) or not names or not isinstance(table, dict):
        return None
    chosen = {str(language): str(model) for language, model in table.items()}
    unknown = sorted(set(chosen.values()) - models)
    if unknown or "*" not in chosen:
        raise ValueError(f"catalogue: [openai.languages] must name models of the catalogue "
                         f"and a '*' for every other language (unknown: {unknown})")
    return LanguageModels(tuple(str(n) for n in names), chosen)


def _elevenlabs(table: dict[str, dict[str, str]], models: dict[str, ModelEntry]
                ) -> dict[str, ElevenLabsVoice]:
    """The ElevenLabs voice ids, each checked to name a catalogue model (`model:voice`)."""
    found = {}
    for voice_id, entry in table.items():
        voice = str(entry.get("voice", ""))
        model, colon, name = voice.partition(":")
        if not colon or not name or model not in models:
            raise ValueError(f"catalogue: [elevenlabs_voices] {voice_id}: voice '{voice}' is not "
                             f"model:voice with a model of the catalogue ({', '.join(models)})")
        found[voice_id] = ElevenLabsVoice(str(entry.get("name", voice_id)), voice)
    return found


def _voice_map(openai_names: dict[str, str], aliases: dict[str, str]) -> dict[str, str]:
    """A model's name -> voice id map: its OpenAI names, then the aliases (which win)."""
    return openai_names | {name: openai_names.get(to, to) for name, to in aliases.items()}
