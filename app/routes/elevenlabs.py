"""ElevenLabs' API: text to speech (whole, streamed, with character timestamps), voices, models,
user. Served under `/elevenlabs` (an SDK's `base_url`: its `GET /v1/models` would clash with
OpenAI's at the root) and, but for `/v1/models`, at the root too. Errors in ElevenLabs' shape;
keys as `xi-api-key` (or `Authorization: Bearer`)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from app.audio.encoders import StreamEncoder
from app.http.auth import MESSAGE, authenticator
from app.http.clients import client_id
from app.http.errors import InvalidApiKey, NoSuchVoice, shape_errors
from app.protocols import elevenlabs as el
from app.protocols.captioned import audio_json, encoded_segments, ndjson_line
from app.protocols.elevenlabs_ws import ElevenLabsFraming, StreamInput
from app.protocols.native import whole_encoded
from app.protocols.openai import JobResponse, audio_bytes, warnings_header
from app.protocols.timestamps import alignment
from app.routes.ws import idle_timeout, serve
from app.serving.events import JobEvent
from app.serving.job import SpeechJob
from app.serving.service import SpeechService
from engines.base import InvalidParameter, ModelNotFound, VoiceNotFound, WordTiming

PREFIX = "/elevenlabs"
TTS = "/v1/text-to-speech/{voice_id}"


def _service(request: Request) -> SpeechService:
    service: SpeechService = request.app.state.service
    return service


def _voxmux_name(request: Request | WebSocket, voice_id: str) -> str:
    """The VoxMux voice for an ElevenLabs voice id (the catalogue's `[elevenlabs_voices]`)."""
    return el.voxmux_name(request.app.state.elevenlabs_voices, voice_id)


def _authorize(request: Request) -> None:
    auth = authenticator(request)
    if auth.guards_synthesis() and not auth.authorized(request):
        raise InvalidApiKey(MESSAGE)


async def _plan(request: Request, voice_id: str, *, timestamps: bool
                ) -> tuple[SpeechJob, el.OutputFormat]:
    _authorize(request)
    try:
        body = el.TextToSpeech.model_validate_json(await request.body())
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "body"
        raise InvalidParameter(f"{where}: {problem['msg']}", param=where) from None
    out = el.output_format(request.query_params.get("output_format"))
    service = _service(request)
    chosen = el.target(service, _voxmux_name(request, voice_id), body)
    speed = body.voice_settings.speed if body.voice_settings and body.voice_settings.speed else 1.0
    try:
        plan = await service.plan(
            model=chosen.model, voice=chosen.voice, text=body.text, speed=speed,
            language=body.language_code, timestamps=timestamps,
            request_id=request.scope.get("state", {}).get("request_id"),
            client=client_id(request))
    except InvalidParameter as exc:  # ElevenLabs' field is `text`
        if exc.param != "input":
            raise
        raise InvalidParameter(exc.message.replace("'input'", "'text'"), param="text",
                               code=exc.code) from None
    plan.warnings += chosen.warnings
    return service.speak(plan), out


async def convert(voice_id: str, request: Request) -> Response:
    """The audio, in `output_format` (default mp3 44.1 kHz 128 kbps), streamed as it is made.
    A failure before its first audio is an error in ElevenLabs' shape (`el.error`)."""
    job, out = await _plan(request, voice_id, timestamps=False)
    return JobResponse(job, out.fmt, audio_bytes, el.MEDIA_TYPES[out.fmt], rate=out.rate,
                       bit_rate=out.bit_rate, errors=el.error)


def _chunk(job: SpeechJob, audio: bytes, words: list[WordTiming], start: int,
           end: int | None, after: float = 0.0) -> dict[str, Any]:
    aligned = alignment(job.plan.caption_text, words, start, end, after)
    return {"audio_base64": base64.b64encode(audio).decode(), "alignment": aligned,
            "normalized_alignment": aligned}


async def convert_with_timestamps(voice_id: str, request: Request) -> Response:
    """The whole audio as base64 with the alignment of every character sent."""
    job, out = await _plan(request, voice_id, timestamps=True)
    encoder = StreamEncoder(out.fmt, job.sample_rate, out.rate, out.bit_rate)
    data, words = await whole_encoded(job, encoder, request)
    aligned = alignment(job.plan.caption_text, words, 0, None, 0.0)
    headers = {"X-VoxMux-Warnings": warnings_header(job.plan.warnings)} if job.plan.warnings else {}
    return StreamingResponse(
        audio_json("audio_base64", data, {"alignment": aligned, "normalized_alignment": aligned}),
        media_type="application/json", headers=headers)


async def stream_with_timestamps(voice_id: str, request: Request) -> Response:
    """Newline-delimited JSON: each segment's audio as it is made, with its characters."""
    job, out = await _plan(request, voice_id, timestamps=True)

    async def lines(job: SpeechJob, events: AsyncIterator[JobEvent], encoder: StreamEncoder
                    ) -> AsyncIterator[bytes]:
        # Characters of the text aligned so far: each line aligns from there to the end of its
        # segment, so the lines' characters joined are the text sent (spaces between included);
        # characters after the last word are timed from where the words before them ended.
        covered, spoken = 0, 0.0
        try:
            async for piece in encoded_segments(job, events, encoder):
                if piece.span is None:
                    if piece.audio or covered < len(job.plan.caption_text):
                        yield ndjson_line(_chunk(job, piece.audio, [], covered, None, spoken))
                    return
                high = max(covered, piece.span[1])
                yield ndjson_line(_chunk(job, piece.audio, piece.words, covered, high, spoken))
                spoken = max([spoken, *(w.end for w in piece.words)])
                covered = high
        except Exception as exc:  # already a 200: the failure is the last line
            yield ndjson_line(json.loads(bytes(el.error(exc).body)))

    return JobResponse(job, out.fmt, lines, "application/json", {"Cache-Control": "no-cache"},
                       rate=out.rate, bit_rate=out.bit_rate, errors=el.error)


async def list_voices(request: Request) -> Response:
    _authorize(request)
    return JSONResponse({"voices": el.voices(_service(request),
                                             request.app.state.elevenlabs_voices)})


async def search_voices(request: Request) -> Response:
    """ElevenLabs' newer listing (`GET /v2/voices`, the SDK's `voices.search()`): the same
    voices as `/v1/voices`, searched and a page at a time."""
    _authorize(request)
    listed = el.voices(_service(request), request.app.state.elevenlabs_voices)
    return JSONResponse(el.search_voices(listed, request.query_params))


async def get_voice(voice_id: str, request: Request) -> Response:
    _authorize(request)
    table = request.app.state.elevenlabs_voices
    try:  # an unknown model or an unknown voice of a model: the same missing resource
        found = el.find_voice(_service(request), el.voxmux_name(table, voice_id))
    except (ModelNotFound, VoiceNotFound):
        found = None
    if found is None:
        raise NoSuchVoice(f"No voice '{voice_id}'", param="voice_id")
    alias = table.get(voice_id)
    return JSONResponse(el.voice_json(*found, None if alias is None else (voice_id, alias)))


async def list_models(request: Request) -> Response:
    _authorize(request)
    return JSONResponse(el.models(_service(request)))


async def get_user(request: Request) -> Response:
    _authorize(request)
    return JSONResponse(el.user(_service(request)))


async def stream_input(websocket: WebSocket, voice_id: str) -> None:
    """Text in (LLM tokens), audio and alignment out (app.protocols.elevenlabs_ws). A key may
    also come in the first message (`xi_api_key`), as browsers, which cannot set headers,
    send it: then the socket is opened and that message checked before anything is planned."""
    auth = authenticator(websocket)
    in_message = auth.guards_synthesis() and not auth.authorized(websocket, query_token=True)
    mode = StreamInput(_voxmux_name(websocket, voice_id), dict(websocket.query_params),
                       idle_timeout(websocket), key_check=auth if in_message else None)
    await serve(websocket, ElevenLabsFraming(mode), mode, authorized=in_message)


def _router(with_models: bool) -> APIRouter:
    # Out of VoxMux's OpenAPI document: ElevenLabs' API reference is its contract, and its error
    # shape is not the one that document declares for every route.
    router = APIRouter(tags=["elevenlabs"], include_in_schema=False)
    router.add_api_route(TTS, convert, methods=["POST"])
    router.add_api_route(TTS + "/stream", convert, methods=["POST"])
    router.add_api_route(TTS + "/with-timestamps", convert_with_timestamps, methods=["POST"])
    router.add_api_route(TTS + "/stream/with-timestamps", stream_with_timestamps,
                         methods=["POST"])
    router.add_api_websocket_route(TTS + "/stream-input", stream_input)
    router.add_api_route("/v1/voices", list_voices, methods=["GET"])
    router.add_api_route("/v2/voices", search_voices, methods=["GET"])
    router.add_api_route("/v1/voices/{voice_id}", get_voice, methods=["GET"])
    router.add_api_route("/v1/user", get_user, methods=["GET"])
    if with_models:
        router.add_api_route("/v1/models", list_models, methods=["GET"])
    return router


ROOT_PATHS = ("/v1/text-to-speech/", "/v1/voices", "/v2/voices", "/v1/user")
"""ElevenLabs' routes at the root: none of them is a path of OpenAI's or VoxMux's own."""


def install(app: FastAPI) -> None:
    app.include_router(_router(with_models=True), prefix=PREFIX)
    app.include_router(_router(with_models=False))
    shape_errors(app, (PREFIX + "/", *ROOT_PATHS), el.error)
