"""The model catalogue (`config/models.toml`): ids, engines, aliases, OpenAI voice names."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engines.base import ModelNotFound

CREATED = 1_764_633_600  # 2025-12-02, reported as `created` for every local model


@dataclass(frozen=True)
class ModelEntry:
    id: str
    engine: str
    description: str
    default_voice: str
    aliases: tuple[str, ...] = ()
    voice_map: dict[str, str] = field(default_factory=dict)
    """OpenAI voice name -> the model's own voice id."""


@dataclass(frozen=True)
class Catalogue:
    models: dict[str, ModelEntry]
    openai_voices: tuple[str, ...]

    @classmethod
    def load(cls, path: Path) -> Catalogue:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        models = {
            model_id: ModelEntry(
                id=model_id,
                engine=entry["engine"],
                description=entry.get("description", ""),
                default_voice=entry["default_voice"],
                aliases=tuple(entry.get("aliases", ())),
                voice_map=dict(entry.get("voices", {})),
            )
            for model_id, entry in data["models"].items()
        }
        catalogue = cls(models, tuple(data.get("openai", {}).get("voices", ())))
        catalogue._check()
        return catalogue

    def _check(self) -> None:
        seen: dict[str, str] = {}
        for entry in self.models.values():
            for name in (entry.id, *entry.aliases):
                if name in seen:
                    raise ValueError(f"catalogue: '{name}' names both {seen[name]} and {entry.id}")
                seen[name] = entry.id

    @property
    def aliases(self) -> dict[str, str]:
        return {alias: e.id for e in self.models.values() for alias in e.aliases}

    def resolve(self, name: str) -> ModelEntry:
        """A model id or alias -> its entry; `ModelNotFound` otherwise."""
        model_id = name if name in self.models else self.aliases.get(name)
        if model_id is None:
            known = ", ".join([*self.models, *self.aliases])
            raise ModelNotFound(
                f"The model '{name}' does not exist. Available: {known}", param="model"
            )
        return self.models[model_id]
