"""Model and voice listing, and the admin routes that load, unload, switch and rescan models."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query

from app.http.auth import require_admin
from app.http.deps import ServiceDep
from app.protocols.schemas import (
    ERROR_RESPONSES,
    ModelCard,
    ModelList,
    ModelRescanCard,
    RescanResponse,
    SwitchRequest,
    SwitchResponse,
    VoiceCard,
    VoiceList,
)
from app.serving.catalogue import CREATED, ModelEntry
from app.serving.rescan import rescan_models
from app.serving.service import SpeechService
from engines.frontend.detect import language_matches

router = APIRouter(tags=["models"])
ADMIN = [Depends(require_admin)]
"""Dependencies of the routes that change what is loaded (guarded under either auth scope)."""


def _card(service: SpeechService, entry: ModelEntry) -> ModelCard:
    state = service.registry.status()[entry.id]
    engine = service.engines[entry.id]
    return ModelCard(
        id=entry.id,
        created=CREATED,
        engine=entry.engine,
        status=state.status,
        aliases=list(entry.aliases),
        description=entry.description,
        default_voice=entry.default_voice,
        error=state.error,
        voice_errors=dict(getattr(engine, "voice_errors", {})),
    )


@router.get("/v1/models", response_model=ModelList)
async def list_models(service: ServiceDep) -> ModelList:
    return ModelList(data=[_card(service, e) for e in service.catalogue.models.values()])


@router.get("/v1/models/{model_id}", response_model=ModelCard, responses=ERROR_RESPONSES)
async def get_model(model_id: str, service: ServiceDep) -> ModelCard:
    return _card(service, service.catalogue.resolve(model_id))


@router.get("/v1/audio/voices", response_model=VoiceList, responses=ERROR_RESPONSES)
async def list_voices(
    service: ServiceDep,
    model: str | None = Query(None, description="Model id or alias"),
    language: str | None = Query(None, description="Language: `en` also lists en-us and en-gb"),
    gender: str | None = Query(None, description="female or male"),
) -> VoiceList:
    entries = [service.catalogue.resolve(model)] if model else service.catalogue.models.values()
    cards = [
        VoiceCard(id=v.id, name=v.name, language=v.language, gender=v.gender, model=e.id)
        for e in entries
        for v in service.engines[e.id].voices()
        if (not language or language_matches(v.language, language))
        and (not gender or v.gender == gender.lower())
    ]
    return VoiceList(data=cards)


@router.post("/v1/models/rescan", response_model=RescanResponse, responses=ERROR_RESPONSES,
             dependencies=ADMIN)
async def rescan(service: ServiceDep) -> RescanResponse:
    return RescanResponse(data=[
        ModelRescanCard(model=r.model, added=list(r.changes.added),
                        removed=list(r.changes.removed), changed=list(r.changes.changed),
                        voice_errors=r.voice_errors, cache_cleared=r.cache_cleared)
        for r in await rescan_models(service)
    ])


@router.post("/v1/models/switch", response_model=SwitchResponse, responses=ERROR_RESPONSES,
             dependencies=ADMIN)
async def switch_model(body: SwitchRequest, service: ServiceDep) -> SwitchResponse:
    entry = service.catalogue.resolve(body.model)
    result = await service.registry.switch(entry.id, unload_previous=body.unload_previous)
    return SwitchResponse(
        model=entry.id,
        previous=result.previous,
        previous_unloaded=result.previous_unloaded,
        previous_busy=result.previous_busy,
        status=service.registry.status()[entry.id].status,
    )


@router.post("/v1/models/{model_id}/load", response_model=ModelCard, responses=ERROR_RESPONSES,
             dependencies=ADMIN)
async def load_model(model_id: str, service: ServiceDep) -> ModelCard:
    entry = service.catalogue.resolve(model_id)
    await service.registry.load(entry.id)
    return _card(service, entry)


@router.post("/v1/models/{model_id}/unload", response_model=ModelCard,
             responses=ERROR_RESPONSES, dependencies=ADMIN)
async def unload_model(model_id: str, service: ServiceDep) -> ModelCard:
    entry = service.catalogue.resolve(model_id)
    await service.registry.unload(entry.id)
    return _card(service, entry)
