"""`WS /ws/v1/tts` and `WS /ws/v1/tts/text`: streamed speech over WebSockets (see app.wsession)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, WebSocket
from starlette.datastructures import State

from app.auth import authorize_websocket
from app.serving import SpeechService
from app.wsession import ConnectionGate, SpeechSession, TextSession

router = APIRouter(tags=["streaming"])


def _gate(state: State, service: SpeechService) -> ConnectionGate:
    gate: ConnectionGate | None = getattr(state, "ws_gate", None)
    if gate is None:
        gate = state.ws_gate = ConnectionGate(service.settings.ws_max_connections)
    return gate


def _parts(websocket: WebSocket) -> tuple[SpeechService, str, ConnectionGate]:
    service: SpeechService = websocket.app.state.service
    request_id = str(websocket.scope.get("state", {}).get("request_id") or uuid.uuid4().hex)
    return service, request_id, _gate(websocket.app.state, service)


@router.websocket("/ws/v1/tts")
async def speech_socket(websocket: WebSocket) -> None:
    if not await authorize_websocket(websocket):
        return
    service, request_id, gate = _parts(websocket)
    await SpeechSession(websocket, service, request_id).run(gate)


@router.websocket("/ws/v1/tts/text")
async def text_socket(websocket: WebSocket) -> None:
    if not await authorize_websocket(websocket):
        return
    service, request_id, gate = _parts(websocket)
    await TextSession(websocket, service, request_id).run(gate)
