"""The model catalogue (`config/models.toml`): ids, engines, aliases, OpenAI voice names.

It is read once at start into `ModelEntry`s; the registry then owns them (one handle per model)
and resolves names and aliases.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from engines.registry import ModelEntry

CREATED = 1_764_633_600  # 2025-12-02, reported as `created` for every local model


@dataclass(frozen=True)
class Catalogue:
    models: dict[str, ModelEntry]

    @classmethod
    def load(cls, path: Path) -> Catalogue:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        return cls({
            model_id: ModelEntry(
                id=model_id,
                engine=entry["engine"],
                description=entry.get("description", ""),
                default_voice=entry["default_voice"],
                aliases=tuple(entry.get("aliases", ())),
                voice_map=dict(entry.get("voices", {})),
            )
            for model_id, entry in data["models"].items()
        })
