"""The Model Context Protocol: VoxMux's speech as tools an LLM agent calls, on the same speech
service as every other route (`mcp` SDK, `MCPServer`).

Tools: `speak` (text or SSML into audio, returned as an MCP audio block with the word timings as
structured content), `list_voices`, `start_audiobook` / `audiobook_status` (a long-form job) and
`pronounce` (a word as read now and with a proposed reading, as the Studio's pronunciation panel
plays them). Resource: `voxmux://catalogue`, the models and their voices. Served at `/mcp`
(streamable HTTP, behind the API keys of `/v1`: `mount`) and over stdio by `voxmux mcp`.

Budgets and errors are the HTTP routes' (`SpeechService.plan`): a request over one is a tool
error that names it and its setting, never a crash of the session. A client that cancels a
call cancels the task awaiting the speech, and with it the engine call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import AudioContent, CallToolResult, TextContent
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from app.http.auth import MESSAGE, authenticator
from app.http.clients import client_id
from app.http.errors import InvalidApiKey, error_response
from app.jobs.front import card_payload, owner_of, start_job
from app.jobs.model import JobNotFound
from app.jobs.runner import JobRunner
from app.protocols.schemas import JobRequest
from app.serving.service import SpeechService
from app.studio import lexicon
from app.studio.view import FORMATS, synthesize
from engines.base import VoxMuxError
from engines.frontend.detect import language_matches

PATH = "/mcp"
OWNER = "mcp"
"""The owner of the jobs started over stdio (over HTTP, the key's owner, as on `/v1`)."""
MIME = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac",
        "wav": "audio/wav"}


def build(service: SpeechService, runner: JobRunner | None) -> MCPServer:
    """The MCP server on `service` (and `runner` for the audiobook tools, where jobs run)."""
    server = MCPServer(
        "voxmux", title="VoxMux", version="0.1.0", log_level="WARNING",
        instructions="Text-to-speech on local engines: speak text or SSML with word timings, "
        "list voices, make audiobooks, try pronunciations.")

    def _request_id() -> str:
        return f"mcp_{uuid.uuid4().hex[:16]}"

    @server.tool(description="Speak text or SSML (starting with <speak>) and return the audio "
                 "with each word's start and end in seconds. model: a model id or alias "
                 "(tts-1 follows the text's language); voice: a voice id (list_voices); "
                 "format: mp3, opus, aac, flac or wav.")
    async def speak(ctx: Context, text: str, model: str = "tts-1", voice: str | None = None,
                    speed: float = 1.0, format: str = "wav") -> CallToolResult:
        if format not in FORMATS:
            raise ToolError(f"format must be one of {', '.join(FORMATS)}")
        try:
            clip = await synthesize(service, model=model, text=text, voice=voice, speed=speed,
                                    fmt=format, request_id=_request_id(), client=_client(ctx))
        except VoxMuxError as exc:
            raise ToolError(_said(exc)) from None
        milliseconds = clip.stats.get("audio_duration_ms")
        meta = {"model": clip.model, "voice": clip.voice, "format": clip.format,
                "sample_rate": clip.sample_rate,
                "audio_seconds": (milliseconds / 1000 if isinstance(milliseconds, int | float)
                                  else None),
                "words": clip.words, "warnings": clip.warnings}
        return CallToolResult(
            content=[AudioContent(data=base64.b64encode(clip.data).decode(),
                                  mime_type=MIME[clip.format]),
                     TextContent(text=json.dumps(meta, ensure_ascii=False))],
            structured_content=meta)

    @server.tool(description="The voices, optionally of one model and one language (en also "
                 "lists en-us and en-gb), and whether each model is neural.")
    async def list_voices(model: str | None = None, language: str | None = None
                          ) -> dict[str, Any]:
        try:
            return {"voices": _voices(service, model, language)}
        except VoxMuxError as exc:
            raise ToolError(_said(exc)) from None

    @server.tool(description="Start an audiobook: a long text, Markdown (a chapter per # "
                 "heading) or SSML spoken as a job that survives restarts. Returns its id; "
                 "audiobook_status tells its progress and where its results are. format m4b "
                 "makes one audiobook file with chapter markers.")
    async def start_audiobook(ctx: Context, text: str, model: str = "tts-1",
                              voice: str | None = None, input_format: str = "text",
                              format: str = "mp3", title: str | None = None) -> dict[str, Any]:
        jobs = _jobs(runner)
        try:
            body = JobRequest.model_validate({
                "model": model, "voice": voice, "input": text, "input_format": input_format,
                "response_format": format, "title": title})
        except ValueError as exc:
            raise ToolError(f"Invalid audiobook request: {exc}") from None
        try:
            job = await start_job(jobs, _owner(ctx), body, _client(ctx))
            return await _card(jobs, job.id, _owner(ctx))
        except VoxMuxError as exc:
            raise ToolError(_said(exc)) from None

    @server.tool(description="An audiobook's status, progress (segments done, audio seconds, "
                 "time left) and, once done, the paths of its audio, chapters and ZIP on this "
                 "server (GET them with the same API key).")
    async def audiobook_status(ctx: Context, job_id: str) -> dict[str, Any]:
        try:
            return await _card(_jobs(runner), job_id, _owner(ctx))
        except VoxMuxError as exc:
            raise ToolError(_said(exc)) from None

    @server.tool(description="Hear a word as it is read now and with a proposed reading (IPA "
                 "between slashes, /bəˈnænə/, or a respelling), in a sentence or alone: two "
                 "clips, to choose a lexicon entry.")
    async def pronounce(ctx: Context, word: str, reading: str, model: str = "tts-1",
                        text: str = "", voice: str = "", language: str = "en"
                        ) -> CallToolResult:
        try:
            trial = await lexicon.trial(service, word=word, reading=reading, text=text,
                                        model=model, voice=voice, language=language,
                                        request_id=_request_id(), client=_client(ctx))
        except VoxMuxError as exc:
            raise ToolError(_said(exc)) from None
        meta = {"word": trial.word, "reading": trial.reading, "text": trial.text,
                "clips": ["as read now", "with the reading"]}
        return CallToolResult(
            content=[*(AudioContent(data=base64.b64encode(c.data).decode(),
                                    mime_type=MIME[c.format]) for c in (trial.now, trial.after)),
                     TextContent(text=json.dumps(meta, ensure_ascii=False))],
            structured_content=meta)

    @server.resource("voxmux://catalogue", name="catalogue", mime_type="application/json",
                     description="Every model: its aliases and voices")
    async def catalogue() -> str:
        models = [{"id": h.id, "aliases": [a for a, m in service.registry.aliases.items()
                                           if m == h.id],
                   "voices": [v.id for v in h.engine.voices()]} for h in service.models()]
        return json.dumps({"models": models}, ensure_ascii=False)

    return server


def _said(exc: VoxMuxError) -> str:
    """A VoxMux error as a tool error's text: the message, and the code an agent can act on."""
    return f"{exc.message} ({exc.code or type(exc).__name__})"


def _voices(service: SpeechService, model: str | None, language: str | None
            ) -> list[dict[str, Any]]:
    handles = [service.registry.resolve(model)] if model else service.models()
    return [{"model": h.id, "id": v.id, "name": v.name, "language": v.language,
             "gender": v.gender, "neural": h.id != "espeak"}
            for h in handles for v in h.engine.voices()
            if not language or language_matches(v.language, language)]


def _jobs(runner: JobRunner | None) -> JobRunner:
    if runner is None:
        raise ToolError("Audiobooks need the job store, which this process does not run")
    try:
        return runner.available()
    except VoxMuxError as exc:
        raise ToolError(_said(exc)) from None


def _owner(ctx: Context) -> str:
    """Whose jobs: over HTTP, the API key's (as on `/v1/audio/jobs`, so the key reads their
    results there); over stdio, `OWNER`."""
    request = ctx.request_context.request
    return owner_of(request) if isinstance(request, Request) else OWNER


def _client(ctx: Context) -> str:
    """Who asks, as every route counts clients (fair turns, lexicons): over HTTP the key or
    address (`client_id`); over stdio, `OWNER`."""
    request = ctx.request_context.request
    return client_id(request) if isinstance(request, Request) else OWNER


async def _card(runner: JobRunner, job_id: str, owner: str) -> dict[str, Any]:
    job = await asyncio.to_thread(runner.store.job, job_id)
    if job is None or job.owner != owner:
        raise JobNotFound(f"No audiobook {job_id}", param="job_id")
    return await card_payload(runner, job, chapters=True)


def mount(app: Any, server: MCPServer) -> None:
    """`server` at `/mcp` of `app` (streamable HTTP), behind the API keys; its session manager
    must run in the app's lifespan (`server.session_manager.run()`). The SDK's own check of the
    Host header is off: VoxMux's (`VOXMUX_ALLOWED_HOSTS`) answers before it."""
    from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
    from starlette.routing import Route

    server.streamable_http_app(streamable_http_path=PATH, host="0.0.0.0")  # makes the manager
    app.router.routes.append(Route(PATH, endpoint=Guarded(
        StreamableHTTPASGIApp(server.session_manager)), methods=["GET", "POST", "DELETE"]))


class Guarded:
    """The MCP app behind the API keys that guard `/v1` (`VOXMUX_AUTH_SCOPE=all`): a request
    without a valid key is answered 401 in OpenAI's error shape before the SDK sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            auth = authenticator(request)
            if auth.guards_synthesis() and not auth.authorized(request):
                await error_response(InvalidApiKey(MESSAGE))(scope, receive, send)
                return
        await self.app(scope, receive, send)
