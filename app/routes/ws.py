"""Streamed speech over WebSockets: VoxMux's `/ws/v1/tts` and `/ws/v1/tts/text`
(app.protocols.websocket), LunaVox's `/v1/stream` and `/v1/stream/text`
(app.protocols.lunavox_ws); one connection limit for all."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, WebSocket
from starlette.datastructures import State

from app.http.auth import authorize_websocket
from app.protocols.lunavox_ws import StreamSession, TextStreamSession
from app.protocols.websocket import ConnectionGate, Session, SpeechSession, TextSession
from app.serving.service import SpeechService

router = APIRouter(tags=["streaming"])


def _gate(state: State, service: SpeechService) -> ConnectionGate:
    gate: ConnectionGate | None = getattr(state, "ws_gate", None)
    if gate is None:
        gate = state.ws_gate = ConnectionGate(service.settings.ws_max_connections)
    return gate


async def _serve(websocket: WebSocket, kind: type[Session]) -> None:
    if not await authorize_websocket(websocket):
        return
    service: SpeechService = websocket.app.state.service
    request_id = str(websocket.scope.get("state", {}).get("request_id") or uuid.uuid4().hex)
    await kind(websocket, service, request_id).run(_gate(websocket.app.state, service))


@router.websocket("/ws/v1/tts")
async def speech_socket(websocket: WebSocket) -> None:
    await _serve(websocket, SpeechSession)


@router.websocket("/ws/v1/tts/text")
async def text_socket(websocket: WebSocket) -> None:
    await _serve(websocket, TextSession)


@router.websocket("/v1/stream")
async def lunavox_socket(websocket: WebSocket) -> None:
    await _serve(websocket, StreamSession)


@router.websocket("/v1/stream/text")
async def lunavox_text_socket(websocket: WebSocket) -> None:
    await _serve(websocket, TextStreamSession)
