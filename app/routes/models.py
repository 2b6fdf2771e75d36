"""Model and voice listing, and the admin routes that load, unload, switch and rescan models."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from app.http.auth import require_admin
from app.http.deps import ServiceDep
from app.protocols.schemas import (
    ERROR_RESPONSES,
    AudioModel,
    AudioModelList,
    ModelCard,
    ModelList,
    ModelRescanCard,
    RescanResponse,
    SwitchRequest,
    SwitchResponse,
    VoiceCard,
    VoiceList,
)
from app.serving.catalogue import CREATED
from app.serving.fleet import ModelView
from app.serving.rescan import rescan_models
from app.serving.scheduler import Lane
from app.serving.service import SpeechService
from engines.frontend.detect import language_matches
from engines.registry import ModelHandle

router = APIRouter(tags=["models"])
ADMIN = [Depends(require_admin)]
"""Dependencies of the routes that change what is loaded (guarded under either auth scope)."""


def _card(handle: ModelHandle[Lane], view: ModelView, name: str | None = None) -> ModelCard:
    """The card of a model, or of one of its aliases (`name`), which carries the same state."""
    entry = handle.entry
    alias = name if name is not None and name != entry.id else None
    return ModelCard(
        id=alias or entry.id,
        alias_of=entry.id if alias else None,
        created=CREATED,
        engine=handle.engine.name,
        status=view.status,
        aliases=list(entry.aliases),
        description=entry.description,
        default_voice=entry.default_voice,
        current=view.current,
        running=view.in_flight,
        error=view.error,
        voice_errors=dict(getattr(handle.engine, "voice_errors", {})),
        replicas=list(view.replicas) if view.replicas is not None else None,
    )


async def _card_now(service: SpeechService, handle: ModelHandle[Lane], name: str | None = None
                    ) -> ModelCard:
    return _card(handle, (await service.model_views())[handle.id], name)


@router.get("/v1/models", response_model=ModelList)
async def list_models(service: ServiceDep) -> ModelList:
    """Every model, then every alias as an entry of its own (OpenAI clients list `tts-1`)."""
    registry = service.registry
    views = await service.model_views()
    cards = [_card(handle, views[handle.id]) for handle in service.models()]
    cards += [_card(registry[model_id], views[model_id], alias)
              for alias, model_id in registry.aliases.items()]
    return ModelList(data=cards)


@router.get("/v1/models/{model_id}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def get_model(model_id: str, service: ServiceDep) -> ModelCard:
    return await _card_now(service, service.registry.resolve(model_id), model_id)


@router.get("/v1/audio/voices", response_model=VoiceList, responses=ERROR_RESPONSES)
async def list_voices(
    service: ServiceDep,
    model: str | None = Query(None, description="Model id or alias"),
    language: str | None = Query(None, description="Language: `en` also lists en-us and en-gb"),
    gender: str | None = Query(None, description="female or male"),
) -> VoiceList:
    handles = [service.registry.resolve(model)] if model else service.models()
    cards = [
        VoiceCard(id=v.id, name=v.name, language=v.language, gender=v.gender, model=h.id)
        for h in handles
        for v in h.engine.voices()
        if (not language or language_matches(v.language, language))
        and (not gender or v.gender == gender.lower())
    ]
    return VoiceList(data=cards, voices=cards)


@router.get("/v1/audio/models", response_model=AudioModelList)
async def list_audio_models(service: ServiceDep) -> AudioModelList:
    """Speech models and aliases as Open WebUI lists them (`{"models": [{"id", "name"}]}`)."""
    names = [h.id for h in service.models()] + list(service.registry.aliases)
    return AudioModelList(models=[AudioModel(id=name, name=name) for name in names])


@router.post("/v1/models/rescan", response_model=RescanResponse, responses=ERROR_RESPONSES,
             dependencies=ADMIN)
async def rescan(service: ServiceDep) -> RescanResponse:
    service.local_only("rescanned")
    return RescanResponse(data=[
        ModelRescanCard(model=r.model, added=list(r.changes.added),
                        removed=list(r.changes.removed), changed=list(r.changes.changed),
                        voice_errors=r.voice_errors, cache_cleared=r.cache_cleared)
        for r in await rescan_models(service)
    ])


@router.post("/v1/models/switch", response_model=SwitchResponse, responses=ERROR_RESPONSES,
             dependencies=ADMIN)
async def switch_model(body: SwitchRequest, service: ServiceDep) -> SwitchResponse:
    handle = service.registry.resolve(body.model)
    result = await service.switch_model(handle.id, unload_previous=body.unload_previous)
    return SwitchResponse(
        model=handle.id,
        previous=result.previous,
        previous_unloaded=result.previous_unloaded,
        previous_busy=result.previous_busy,
        status=handle.status,
    )


@router.post("/v1/models/{model_id}/load", response_model=ModelCard, responses=ERROR_RESPONSES,
             dependencies=ADMIN)
async def load_model(model_id: str, service: ServiceDep) -> ModelCard:
    handle = service.registry.resolve(model_id)
    await service.load_model(handle.id)
    return await _card_now(service, handle)


@router.post("/v1/models/{model_id}/unload", response_model=ModelCard,
             responses=ERROR_RESPONSES, dependencies=ADMIN)
async def unload_model(model_id: str, service: ServiceDep) -> ModelCard:
    handle = service.registry.resolve(model_id)
    await service.unload_model(handle.id)
    return await _card_now(service, handle)
