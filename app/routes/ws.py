"""Streamed speech over WebSockets: each route is a framing and an input mode over one session
loop (app.protocols.websocket); one connection limit for all.

| route | framing | input |
|---|---|---|
| `/ws/v1/tts` | VoxMux | one request |
| `/ws/v1/tts/text` | VoxMux | streamed text |
| `/v1/stream` | LunaVox | one request |
| `/v1/stream/text` | LunaVox | streamed text |
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, WebSocket

from app.http.auth import authorize_websocket
from app.http.clients import client_id
from app.protocols import lunavox
from app.protocols.schemas import (
    StreamRequest,
    SynthOptions,
    WsOptions,
    WsSpeechRequest,
    WsTextMessage,
)
from app.protocols.voxmux_ws import VoxMuxFraming
from app.protocols.websocket import (
    Command,
    ConnectionGate,
    Framing,
    InputMode,
    OneRequest,
    Session,
    StreamedText,
    parse,
)
from app.serving.service import SpeechService

router = APIRouter(tags=["streaming"])


def _gate(websocket: WebSocket, service: SpeechService) -> ConnectionGate:
    state = websocket.app.state
    gate: ConnectionGate | None = getattr(state, "ws_gate", None)
    if gate is None:
        settings = service.settings
        gate = state.ws_gate = ConnectionGate(settings.ws_max_connections,
                                              settings.ws_max_connections_per_client)
    return gate


def idle_timeout(websocket: WebSocket) -> float:
    timeout: float = websocket.app.state.settings.ws_text_idle_timeout
    return timeout


def _voxmux_fragment(payload: dict[str, Any]) -> Command:
    message = parse(WsTextMessage, payload)
    return message.text, message.type


async def serve(websocket: WebSocket, framing: Framing, mode: InputMode, *,
                authorized: bool = False) -> None:
    """One session of `framing` over `mode` (ElevenLabs' stream-input too); `authorized`: the
    mode checks the key itself (in the first message)."""
    if not authorized and not await authorize_websocket(websocket):
        return
    service: SpeechService = websocket.app.state.service
    request_id = str(websocket.scope.get("state", {}).get("request_id") or uuid.uuid4().hex)
    session = Session(websocket, service, request_id, client_id(websocket), framing, mode)
    await session.run(_gate(websocket, service))


@router.websocket("/ws/v1/tts")
async def speech_socket(websocket: WebSocket) -> None:
    await serve(websocket, VoxMuxFraming(text_in=False),
                 OneRequest(WsSpeechRequest, cancel_message=True))


@router.websocket("/ws/v1/tts/text")
async def text_socket(websocket: WebSocket) -> None:
    await serve(websocket, VoxMuxFraming(text_in=True),
                 StreamedText(WsOptions, _voxmux_fragment, idle_timeout(websocket)))


@router.websocket("/v1/stream")
async def lunavox_socket(websocket: WebSocket) -> None:
    await serve(websocket, lunavox.LunaVoxFraming(text_in=False),
                 OneRequest(StreamRequest, cancel_message=False))


@router.websocket("/v1/stream/text")
async def lunavox_text_socket(websocket: WebSocket) -> None:
    await serve(websocket, lunavox.LunaVoxFraming(text_in=True),
                 StreamedText(SynthOptions, lunavox.fragment, idle_timeout(websocket)))
