"""Typed dependencies over the app's state; routes declare what they need by annotation.

Each is an `async def` though none awaits: FastAPI runs a plain `def` dependency in its thread
pool, a thread hop per dependency per request (three on the speech route) for a dict lookup."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.requests import HTTPConnection

from app.http.clients import client_id
from app.serving import tracing
from app.serving.service import SpeechService
from app.settings import Settings


async def _service(request: Request) -> SpeechService:
    service: SpeechService = request.app.state.service
    return service


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def request_id(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", ""))


ServiceDep = Annotated[SpeechService, Depends(_service)]
SettingsDep = Annotated[Settings, Depends(_settings)]
RequestIdDep = Annotated[str, Depends(request_id)]
async def _client(request: HTTPConnection) -> str:
    client = client_id(request)
    tracing.current().set_attribute("voxmux.client", client)
    return client


ClientDep = Annotated[str, Depends(_client)]
"""Who is asking (`app.http.clients`)."""
