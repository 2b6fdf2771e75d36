"""Speech over WebSockets: one session loop, composed of a framing and an input mode.

The *input mode* says how the client sends its text: `OneRequest` (the first message holds the
text) or `StreamedText` (the first message holds the options, then text fragments arrive while
audio goes out). The *framing* says what the client sees around the audio: VoxMux's frames
(app.protocols.voxmux_ws) or LunaVox's (app.protocols.lunavox). Four routes, two of each.

The session reads the client in a task of its own, so a cancel, a disconnect or new fragments
are seen while audio is synthesized and sent; only the session's own task writes. The speech job
is owned by `async with`, so it has stopped before the session ends, whatever ended it.
Limits, whatever the framing: a first message within `ws_first_message_timeout` (else 1008),
messages within `ws_max_message_bytes` (1009), JSON objects in text frames (1003), at most
`ws_max_connections` sessions, `ws_max_connections_per_client` of one client (1013); close codes
and frames come from the error table. A text-in session that sends nothing for
`ws_text_idle_timeout` has its text ended for it (everything it sent is spoken, then it closes).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ValidationError

from app.audio.encoders import StreamEncoder
from app.http.errors import (
    MessageTooBig,
    NoRequest,
    NotJson,
    TooManySessions,
    describe_validation_error,
)
from app.serving.events import SegmentEnd, SegmentWords
from app.serving.job import SpeechJob
from app.serving.plan import SpeechPlan
from app.serving.service import SpeechService
from app.text.feed import TextFeed
from engines.base import Audio, InvalidParameter, VoxMuxError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

NORMAL = 1000
FRAME_BYTES = 32768
"""Largest binary audio frame: far below the 1 MiB message limit most clients default to."""


@dataclass(frozen=True)
class Closing:
    frame: dict[str, Any] | None
    code: int
    reason: str


@dataclass(frozen=True)
class Progress:
    elapsed_ms: float
    segments_done: int
    audio_ms: float


class Framing(Protocol):
    """What the client sees around the audio; one instance per session."""

    async def plan(self, service: SpeechService, options: BaseModel, text: str | None,
                   request_id: str, client: str) -> SpeechPlan:
        """Plan the request from the first message (`text` None: streamed text follows)."""

    def audio(self, ws: WebSocket, plan: SpeechPlan) -> AudioOut: ...

    def started(self, job: SpeechJob) -> dict[str, Any] | None: ...

    def segment(self, end: SegmentEnd) -> dict[str, Any] | None: ...

    def words(self, words: SegmentWords) -> dict[str, Any] | None:
        """The frame for a segment's word timings (only plans with timestamps have them)."""

    def keepalive(self, progress: Progress) -> dict[str, Any] | None: ...

    def done(self, job: SpeechJob) -> dict[str, Any]: ...

    def failure(self, exc: BaseException, job: SpeechJob | None, audio_sent: bool) -> Closing:
        """The final frame (or none) and the close for a session ended by `exc`."""


class InputMode(Protocol):
    """How the client sends its text."""

    idle_timeout: float | None
    """Seconds without a message after which `quiet` is called; None: never."""

    async def open(self, session: Session) -> tuple[BaseModel, str | None]:
        """Read the first message: the options, and the text if it holds it."""

    def message(self, payload: dict[str, Any], job: SpeechJob) -> None:
        """Handle a message after the first; may feed text, end it, or cancel the job."""

    def quiet(self, job: SpeechJob) -> None:
        """The client sent nothing for `idle_timeout` seconds."""


class AudioOut:
    """Sends audio as whole int16 samples: raw binary frames, or base64 in JSON frames."""

    def __init__(self, ws: WebSocket, sample_rate: int, wav: bool = False,
                 as_json: Callable[[bytes], dict[str, Any]] | None = None) -> None:
        self._ws = ws
        self._as_json = as_json
        self._encoder = StreamEncoder("wav" if wav else "pcm", sample_rate)
        self.sample_rate = sample_rate
        self.samples_sent = 0
        """Samples handed to the socket so far (the audio a cancel leaves the client with)."""
        self.frames = 0
        """Audio frames sent so far (binary or JSON)."""

    async def header(self) -> None:
        """The WAV header (streaming sizes) for `format: wav`; nothing for raw PCM."""
        if data := self._encoder.encode(np.zeros(0, dtype=np.float32)):
            await self._send(data)

    async def send(self, samples: Audio) -> None:
        data = self._encoder.encode(samples)
        for start in range(0, len(data), FRAME_BYTES):
            await self._send(data[start : start + FRAME_BYTES])
        self.samples_sent += len(samples)

    async def _send(self, data: bytes) -> None:
        self.frames += 1
        if self._as_json is None:
            await self._ws.send_bytes(data)
        else:
            await self._ws.send_json(self._as_json(data))


def parse(model: type[M], payload: dict[str, Any]) -> M:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {}
        param, message = describe_validation_error(first)
        raise InvalidParameter(message, param=param, code=first.get("type")) from None


def base64_frame(data: bytes) -> dict[str, Any]:
    return {"type": "audio", "audio": base64.b64encode(data).decode()}


class ConnectionGate:
    """Counts open sessions against limits shared by every WebSocket route: in all, and of one
    client."""

    def __init__(self, limit: int, per_client: int) -> None:
        self.limit = limit
        self.per_client = per_client
        self.open = 0
        self._clients: Counter[str] = Counter()

    def enter(self, client: str) -> VoxMuxError | None:
        """Take a place for `client`, or say why there is none."""
        if self.open >= self.limit:
            return TooManySessions("Too many open WebSocket sessions; retry later")
        if self._clients[client] >= self.per_client:
            return TooManySessions(
                f"This client has {self._clients[client]} WebSocket sessions open, the most one "
                "client may; close one or retry later")
        self.open += 1
        self._clients[client] += 1
        return None

    def leave(self, client: str) -> None:
        self.open -= 1
        self._clients[client] -= 1
        if not self._clients[client]:
            del self._clients[client]


class Session:
    def __init__(self, ws: WebSocket, service: SpeechService, request_id: str, client: str,
                 framing: Framing, mode: InputMode) -> None:
        self.ws = ws
        self.service = service
        self.settings = service.settings
        self.request_id = request_id
        self.client = client
        self.framing = framing
        self.mode = mode
        self.opened = time.perf_counter()
        self.samples_sent = 0
        self.segments_sent = 0
        self._job: SpeechJob | None = None
        self._reader: asyncio.Task[None] | None = None
        self._went_quiet = False
        """The client sent nothing for the input mode's idle timeout."""

    async def run(self, gate: ConnectionGate) -> None:
        await self.ws.accept()
        if (refusal := gate.enter(self.client)) is not None:
            await self._fail(refusal)
            return
        try:
            await self._serve()
        except WebSocketDisconnect:
            log.info("ws %s: the client went away", self.request_id)
        except Exception as exc:
            await self._fail(exc)
        finally:
            await self._stop_reader()
            gate.leave(self.client)

    async def _serve(self) -> None:
        options, text = await self.mode.open(self)
        plan = await self.framing.plan(self.service, options, text, self.request_id,
                                       self.client)
        async with self.service.speak(plan) as job:
            self._job = job
            try:
                await self._stream(job)
            except WebSocketDisconnect:
                raise
            except Exception as exc:  # told now; the job's exit then waits for the engine
                await self._fail(exc)
                return
            reason = "done"
            if self._went_quiet:
                reason = f"No message for {self.mode.idle_timeout:g} s: the text ended there"
            await self._close(self.framing.done(job), NORMAL, reason)

    async def _stream(self, job: SpeechJob) -> None:
        if (frame := self.framing.started(job)) is not None:
            await self.ws.send_json(frame)
        out = self.framing.audio(self.ws, job.plan)
        await out.header()
        self._reader = asyncio.create_task(self._read(job), name=f"ws-read-{self.request_id}")
        events = job.events()
        while (event := await self._watch(anext(events, None))) is not None:
            if isinstance(event, SegmentEnd):
                self.segments_sent += 1
                if (frame := self.framing.segment(event)) is not None:
                    await self.ws.send_json(frame)
                continue
            if isinstance(event, SegmentWords):
                if (frame := self.framing.words(event)) is not None:
                    await self.ws.send_json(frame)
                continue
            self.samples_sent += len(event)
            await out.send(event)

    async def _read(self, job: SpeechJob) -> None:
        """Read the client after its first message; ends with a disconnect or a bad message."""
        while True:
            try:
                async with asyncio.timeout(None if self._went_quiet else self.mode.idle_timeout):
                    payload = await self.receive()
            except TimeoutError:
                self._went_quiet = True
                self.mode.quiet(job)
                continue
            self.mode.message(payload, job)

    async def _watch(self, awaitable: Awaitable[T]) -> T:
        """Await while watching the reader: its failure (a disconnect, a bad message) cancels the
        job and is raised here; `keepalive` frames go out whenever nothing came for a while."""
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                watched: set[asyncio.Future[Any]] = {task}
                if self._reader is not None:
                    watched.add(self._reader)
                await asyncio.wait(watched, timeout=self.settings.ws_keepalive,
                                   return_when=asyncio.FIRST_COMPLETED)
                if self._reader is not None and self._reader.done():
                    if self._job is not None:
                        self._job.cancel()
                    self._reader.result()
                if task.done():
                    return task.result()
                progress = Progress(
                    elapsed_ms=round((time.perf_counter() - self.opened) * 1000, 1),
                    segments_done=self.segments_sent,
                    audio_ms=round(self.samples_sent / self._rate * 1000, 1),
                )
                if (frame := self.framing.keepalive(progress)) is not None:
                    await self.ws.send_json(frame)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    @property
    def _rate(self) -> int:
        return self._job.sample_rate if self._job is not None else 1

    # -- reading -----------------------------------------------------------------------------

    async def first(self, model: type[M]) -> M:
        limit = self.settings.ws_first_message_timeout
        try:
            async with asyncio.timeout(limit):
                message = await self.ws.receive()
        except TimeoutError:
            raise NoRequest(f"No request arrived within {limit:g} s of connecting") from None
        return parse(model, self.payload(message))

    async def receive(self) -> dict[str, Any]:
        return self.payload(await self.ws.receive())

    def payload(self, message: Mapping[str, Any]) -> dict[str, Any]:
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", NORMAL))
        text = message.get("text")
        if text is None:
            raise NotJson("Send JSON in text frames; binary frames are not accepted")
        limit = self.settings.ws_max_message_bytes
        if len(text) > limit or len(text.encode()) > limit:
            raise MessageTooBig(f"A message may be at most {limit} bytes")
        try:
            payload = json.loads(text)
        except RecursionError:
            raise NotJson("The message is nested too deeply to read") from None
        except ValueError as exc:
            raise NotJson(f"The message is not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise NotJson("The message must be a JSON object")
        return payload

    # -- ending ------------------------------------------------------------------------------

    async def _fail(self, exc: BaseException) -> None:
        closing = self.framing.failure(exc, self._job, self.samples_sent > 0)
        if closing.code == 1011:  # a server failure, not a client's mistake
            log.error("ws %s failed", self.request_id, exc_info=exc)
        await self._close(closing.frame, closing.code, closing.reason)

    async def _stop_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _close(self, frame: dict[str, Any] | None, code: int, reason: str) -> None:
        """Send `frame` (None: no frame), then close with `code` and `reason`."""
        await self._stop_reader()
        try:
            if frame is not None:
                await self.ws.send_json(frame)
            await self.ws.close(code, close_reason(reason))
        except (WebSocketDisconnect, RuntimeError, OSError):
            log.info("ws %s: the client left before the close (%d)", self.request_id, code)


def close_reason(text: str) -> str:
    """`text` cut to the 123 bytes a close frame can carry, on a character boundary."""
    data = text.encode()
    return text if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."


# -- input modes ---------------------------------------------------------------------------------


class _WithInput(Protocol):
    input: str


class OneRequest:
    """The first message holds the whole request; later messages may only cancel it."""

    idle_timeout: float | None = None

    def __init__(self, schema: type[BaseModel], *, cancel_message: bool) -> None:
        """`schema`: the request model, with its text in `input`."""
        self.schema = schema
        self.cancel_message = cancel_message
        """Whether `{"type": "cancel"}` cancels (VoxMux); otherwise later messages are read only
        to see a disconnect (LunaVox)."""

    async def open(self, session: Session) -> tuple[BaseModel, str | None]:
        request = await session.first(self.schema)
        return request, cast(_WithInput, request).input

    def message(self, payload: dict[str, Any], job: SpeechJob) -> None:
        if self.cancel_message and payload.get("type") == "cancel":
            job.cancel()

    def quiet(self, job: SpeechJob) -> None:
        return None


Command = tuple[str, str]
"""A fragment message as (text, command); the command is text, flush, end or cancel."""


class StreamedText:
    """The first message holds the options; then text fragments, flushes, the end, a cancel."""

    def __init__(self, schema: type[BaseModel], fragment: Callable[[dict[str, Any]], Command],
                 idle_timeout: float) -> None:
        self.schema = schema
        self.fragment = fragment
        self.idle_timeout: float | None = idle_timeout

    async def open(self, session: Session) -> tuple[BaseModel, str | None]:
        return await session.first(self.schema), None

    def message(self, payload: dict[str, Any], job: SpeechJob) -> None:
        text, command = self.fragment(payload)
        feed = job.plan.text
        assert isinstance(feed, TextFeed)
        if command == "cancel":
            job.cancel()
            return
        feed.feed(text)
        if command == "flush":
            feed.flush()
        elif command == "end":
            feed.end()

    def quiet(self, job: SpeechJob) -> None:
        """Nothing came for a while: what was sent is spoken, and the session ends."""
        feed = job.plan.text
        assert isinstance(feed, TextFeed)
        feed.end()
