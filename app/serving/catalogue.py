"""The model catalogue (`config/models.toml`): ids, engines, aliases, OpenAI voice names, and
the operator's voice aliases.

It is read once at start into `ModelEntry`s; the registry then owns them (one handle per model)
and resolves names and aliases. `[voice_aliases]` maps voice names other servers' clients send
(HayaKoe's `tsukuyomi`, AngeVoice's `zm_010`) to a voice id or an OpenAI voice name; it is folded
into every model's voice map, an OpenAI name going through that model's own mapping.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from engines.registry import ModelEntry

CREATED = 1_764_633_600  # 2025-12-02, reported as `created` for every local model


@dataclass(frozen=True)
class Catalogue:
    models: dict[str, ModelEntry]
    voice_aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Catalogue:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        aliases = {str(k): str(v) for k, v in data.get("voice_aliases", {}).items()}
        return cls({
            model_id: ModelEntry(
                id=model_id,
                engine=entry["engine"],
                description=entry.get("description", ""),
                default_voice=entry["default_voice"],
                aliases=tuple(entry.get("aliases", ())),
                voice_map=_voice_map(dict(entry.get("voices", {})), aliases),
            )
            for model_id, entry in data["models"].items()
        }, aliases)


def _voice_map(openai_names: dict[str, str], aliases: dict[str, str]) -> dict[str, str]:
    """A model's name -> voice id map: its OpenAI names, then the aliases (which win)."""
    return openai_names | {name: openai_names.get(to, to) for name, to in aliases.items()}
