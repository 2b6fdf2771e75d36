"""Re-reading the user model dirs (`models/`) of every engine while the server runs."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from app.serving.service import SpeechService
from engines.voicescan import Rescannable, VoiceChanges

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelRescan:
    model: str
    changes: VoiceChanges
    voice_errors: dict[str, str] = field(default_factory=dict)
    cache_cleared: int = 0
    """Cached responses of this model dropped because its voices changed."""


async def rescan_models(service: SpeechService) -> list[ModelRescan]:
    """Rescan each model's voice files without unloading it; a model whose voices were added,
    removed or replaced loses its cached audio."""
    results: list[ModelRescan] = []
    for handle in service.models():
        model_id, engine = handle.id, handle.engine
        if not isinstance(engine, Rescannable):
            results.append(ModelRescan(model_id, VoiceChanges()))
            continue
        changes = await asyncio.to_thread(engine.rescan)
        cleared = await service.invalidate_model(model_id) if changes else 0
        if changes:
            log.info("rescan %s: added %s, removed %s, changed %s", model_id,
                     list(changes.added), list(changes.removed), list(changes.changed))
        results.append(ModelRescan(model_id, changes, dict(engine.voice_errors), cleared))
    return results
