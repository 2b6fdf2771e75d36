"""Typed dependencies over the app's state; routes declare what they need by annotation."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.http.clients import client_id
from app.serving.service import SpeechService
from app.settings import Settings


def _service(request: Request) -> SpeechService:
    service: SpeechService = request.app.state.service
    return service


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def request_id(request: Request) -> str:
    return str(request.scope.get("state", {}).get("request_id", ""))


ServiceDep = Annotated[SpeechService, Depends(_service)]
SettingsDep = Annotated[Settings, Depends(_settings)]
RequestIdDep = Annotated[str, Depends(request_id)]
ClientDep = Annotated[str, Depends(client_id)]
"""Who is asking (`app.http.clients`)."""
