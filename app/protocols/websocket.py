"""WebSocket speech sessions: `/ws/v1/tts` (one request) and `/ws/v1/tts/text` (streamed text).

A session reads the client in its own task, so a `cancel`, a disconnect or (text-in) new
fragments are seen while audio is synthesized and sent; only the session's own task writes.
Every session ends with one final frame (`done`, `error` or `cancelled`) and a close, unless the
client is already gone. Close codes: 1000 after a final frame about the request itself (request
errors included, like an HTTP 4xx answer), 1003 a message that is not a JSON object in a text
frame, 1008 no first message in time, 1009 a message over the size limit, 1011 an unexpected
server failure, 1013 too many sessions. LunaVox's routes (app.protocols.lunavox_ws)
reuse these sessions with LunaVox's own frames and codes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from enum import IntEnum
from typing import Any, TypeVar

import numpy as np
from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel, ValidationError

from app.audio import dsp
from app.audio.encoders import StreamEncoder
from app.http.errors import describe_validation_error, error_body
from app.protocols.schemas import WsAudioFormat, WsOptions, WsSpeechRequest, WsTextMessage
from app.serving.memory import MemoryTracker
from app.serving.service import AudioStream, SegmentEnd, SpeechJob, SpeechService
from app.text.split import IncrementalSplitter
from engines.base import Audio, Cancelled, InvalidParameter, SynthesisFailed, VoxMuxError

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

_FRAME_BYTES = 32768
"""Largest binary audio frame: far below the 1 MiB message limit most clients default to."""


class CloseCode(IntEnum):
    NORMAL = 1000
    UNSUPPORTED_DATA = 1003
    POLICY_VIOLATION = 1008
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013


class SessionError(VoxMuxError):
    """A breach of the WebSocket protocol: an error frame, then a close with `close_code`."""

    status = 400
    type = "invalid_request_error"
    close_code = CloseCode.POLICY_VIOLATION
    reason = "protocol violation"


class NotJson(SessionError):
    """A message that is not a JSON object in a text frame."""

    code = "invalid_json"
    close_code = CloseCode.UNSUPPORTED_DATA
    reason = "expected a JSON object in a text frame"


class MessageTooBig(SessionError):
    """A message over `ws_max_message_bytes`."""

    status = 413
    code = "message_too_large"
    close_code = CloseCode.MESSAGE_TOO_BIG
    reason = "message too big"


class NoRequest(SessionError):
    """No first message within `ws_first_message_timeout`."""

    status = 408
    code = "timeout"
    reason = "no request in time"


class TooManySessions(SessionError):
    """Every one of the `ws_max_connections` session places is taken."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_connections"
    close_code = CloseCode.TRY_AGAIN_LATER
    reason = "too many connections"


class TextBacklogFull(SessionError):
    """More than `ws_max_pending_chars` of text waits to be spoken."""

    status = 413
    code = "text_backlog_full"
    reason = "too much text waiting"


class ClientCancel(Exception):
    """The client sent `{"type": "cancel"}`."""


class ConnectionGate:
    """Counts open sessions against a limit shared by both WebSocket routes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def enter(self) -> bool:
        if self.open >= self.limit:
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


def _invalid(exc: ValidationError) -> InvalidParameter:
    first: dict[str, Any] = dict(exc.errors()[0]) if exc.errors() else {}
    param, message = describe_validation_error(first)
    return InvalidParameter(message, param=param, code=first.get("type"))


def _speakable(text: str) -> bool:
    return any(char.isalnum() for char in text)


async def _next_event(stream: AudioStream) -> Audio | SegmentEnd | None:
    try:
        return await stream.next_event()
    except StopAsyncIteration:
        return None


class AudioOut:
    """Sends audio as whole int16 samples: raw binary frames, or base64 in JSON `audio` frames."""

    def __init__(self, ws: WebSocket, sample_rate: int, fmt: WsAudioFormat = "pcm_s16le",
                 binary: bool = True) -> None:
        self._ws = ws
        self._binary = binary
        self._encoder = StreamEncoder("wav" if fmt == "wav" else "pcm", sample_rate)

    async def header(self) -> None:
        """The WAV header (streaming sizes) for `format: wav`; nothing for raw PCM."""
        if data := self._encoder.encode(np.zeros(0, dtype=np.float32)):
            await self._send(data)

    async def audio(self, samples: Audio) -> None:
        data = self._encoder.encode(samples)
        for start in range(0, len(data), _FRAME_BYTES):
            await self._send(data[start : start + _FRAME_BYTES])

    async def _send(self, data: bytes) -> None:
        if self._binary:
            await self._ws.send_bytes(data)
        else:
            await self._ws.send_json({"type": "audio", "audio": base64.b64encode(data).decode()})


class Session:
    """What every WebSocket route shares: limits, reading messages, the reader task, sending a
    job's audio, the final frame. The frames around the audio are VoxMux's; a subclass speaking
    another protocol overrides `keepalive` and `fail`."""

    def __init__(self, ws: WebSocket, service: SpeechService, request_id: str) -> None:
        self.ws = ws
        self.service = service
        self.settings = service.settings
        self.request_id = request_id
        self.opened = time.perf_counter()
        self.sample_rate = 0
        self.samples_sent = 0
        self.segments_sent = 0
        self.first_audio: float | None = None
        self._reader: asyncio.Task[None] | None = None

    async def session(self) -> dict[str, Any]:
        """Serve the session; return the final frame."""
        raise NotImplementedError

    async def listen(self) -> None:
        """Read the client after its first message; return when it cancels."""
        raise NotImplementedError

    async def run(self, gate: ConnectionGate) -> None:
        await self.ws.accept()
        if not gate.enter():
            await self.fail(TooManySessions("Too many open WebSocket sessions; retry later"))
            return
        try:
            await self._finish(await self.session(), CloseCode.NORMAL, "done")
        except WebSocketDisconnect:
            log.info("ws %s: the client went away", self.request_id)
        except Exception as exc:
            if not isinstance(exc, VoxMuxError | ClientCancel):
                log.exception("ws %s failed", self.request_id)
            await self.fail(exc)
        finally:
            await self._stop_reader()
            gate.leave()

    async def fail(self, exc: Exception) -> None:
        """End the session after `exc`: a final frame about it, then the close."""
        if isinstance(exc, ClientCancel | Cancelled):
            await self._finish({"type": "cancelled"}, CloseCode.NORMAL, "cancelled")
        elif isinstance(exc, SessionError):
            await self._finish(_error_frame(exc), exc.close_code, exc.reason)
        elif isinstance(exc, VoxMuxError):
            await self._finish(_error_frame(exc), CloseCode.NORMAL, "error")
        else:
            failure = SynthesisFailed(f"The session failed: {exc}")
            await self._finish(_error_frame(failure), CloseCode.INTERNAL_ERROR, "internal error")

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
            raise WebSocketDisconnect(message.get("code", CloseCode.NORMAL))
        text = message.get("text")
        if text is None:
            raise NotJson("Send JSON in text frames; binary frames are not accepted")
        limit = self.settings.ws_max_message_bytes
        if len(text) > limit or len(text.encode()) > limit:
            raise MessageTooBig(f"A message may be at most {limit} bytes")
        try:
            payload = json.loads(text)
        except ValueError as exc:
            raise NotJson(f"The message is not valid JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise NotJson("The message must be a JSON object")
        return payload

    def start_reader(self) -> None:
        self._reader = asyncio.create_task(self.listen(), name=f"ws-read-{self.request_id}")

    async def _stop_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """Await while watching the reader; send `keepalive()` whenever nothing came for a while.

        Raises `ClientCancel` when the client cancelled, or whatever ended the reader (a
        disconnect, a bad message).
        """
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                watched: set[asyncio.Future[Any]] = {task}
                if self._reader is not None:
                    watched.add(self._reader)
                await asyncio.wait(
                    watched, timeout=self.settings.ws_keepalive, return_when=asyncio.FIRST_COMPLETED
                )
                if self._reader is not None and self._reader.done():
                    self._reader.result()
                    raise ClientCancel
                if task.done():
                    return task.result()
                if (frame := self.keepalive()) is not None:
                    await self.ws.send_json(frame)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    # -- writing -----------------------------------------------------------------------------

    def started(self, job: SpeechJob, options: WsOptions) -> dict[str, Any]:
        self.sample_rate = job.sample_rate
        return {
            "type": "started",
            "request_id": self.request_id,
            "model": job.model.id,
            "voice": job.voice,
            "sample_rate": job.sample_rate,
            "channels": 1,
            "format": options.format,
            "warnings": job.warnings,
        }

    async def segment(self, index: int, text: str, samples: int) -> None:
        self.segments_sent += 1
        frame = {"type": "segment", "index": index, "text": text, "samples": samples}
        await self.ws.send_json(frame)

    async def play(self, stream: AudioStream, out: AudioOut, lead: Audio | None = None) -> int:
        """Send a running job's audio as it comes, `lead` (a pause) first; return its samples.

        Each segment end goes to `segment_end`; the stream is closed however this ends.
        """
        samples = 0
        try:
            while (event := await self.wait(_next_event(stream))) is not None:
                if isinstance(event, SegmentEnd):
                    await self.segment_end(event)
                    continue
                if lead is not None and not samples:
                    event = np.concatenate([lead, event])
                if self.first_audio is None:
                    self.first_audio = time.perf_counter()
                samples += len(event)
                self.samples_sent += len(event)
                await out.audio(event)
        finally:
            await stream.aclose()
        return samples

    async def segment_end(self, event: SegmentEnd) -> None:
        """Called by `play` after each segment of a job; nothing to send by default."""

    def keepalive(self) -> dict[str, Any] | None:
        """The frame sent when no audio came for `ws_keepalive` seconds; None sends nothing."""
        return {
            "type": "progress",
            "elapsed_ms": round((time.perf_counter() - self.opened) * 1000, 1),
            "segments_done": self.segments_sent,
            "audio_ms": round(self.samples_sent / (self.sample_rate or 1) * 1000, 1),
        }

    async def _finish(self, frame: dict[str, Any] | None, code: int, reason: str) -> None:
        """Send `frame` (None: no frame), then close with `code` and `reason`."""
        await self._stop_reader()
        try:
            if frame is not None:
                await self.ws.send_json(frame)
            await self.ws.close(code, _close_reason(reason))
        except (WebSocketDisconnect, RuntimeError, OSError):
            log.info("ws %s: the client left before the close (%d)", self.request_id, code)


def _close_reason(text: str) -> str:
    """`text` cut to the 123 bytes a close frame can carry, on a character boundary."""
    data = text.encode()
    return text if len(data) <= 123 else data[:120].decode(errors="ignore") + "..."


def parse(model: type[M], payload: dict[str, Any]) -> M:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _error_frame(exc: VoxMuxError) -> dict[str, Any]:
    return {"type": "error", **error_body(exc)}


class SpeechSession(Session):
    """`/ws/v1/tts`: one request in, its audio out segment by segment."""

    async def session(self) -> dict[str, Any]:
        request = await self.first(WsSpeechRequest)
        job = self.service.plan_options(request, request.input, self.request_id)
        stream = self.service.run(job)
        try:
            await self.ws.send_json(self.started(job, request) | {"segments": len(job.segments)})
            out = AudioOut(self.ws, job.sample_rate, request.format, request.binary)
            await out.header()
            self.start_reader()
            await self.play(stream, out)
        finally:
            await stream.aclose()
        stats = job.stats.envelope(job.sample_rate, len(job.segments))
        return {"type": "done", "request_id": self.request_id, "stats": stats}

    async def segment_end(self, event: SegmentEnd) -> None:
        await self.segment(event.index, event.text, event.samples)

    async def listen(self) -> None:
        while True:  # anything but a cancel is ignored once the request is running
            if (await self.receive()).get("type") == "cancel":
                return


Planner = Callable[[str], SpeechJob]
"""Plans the job of one sentence with the session's options."""


class TextSession(Session):
    """`/ws/v1/tts/text`: options, then text fragments cut into sentences and spoken in order.

    The reader feeds the splitter and queues finished sentences; the session's own task plans and
    synthesizes them one by one through the speech service, so reading never waits for audio.
    Another protocol over the same loop overrides `open`, `command`, `sentence_done` and `final`.
    """

    def __init__(self, ws: WebSocket, service: SpeechService, request_id: str) -> None:
        super().__init__(ws, service, request_id)
        self.sentences = 0
        self._sentences: asyncio.Queue[str | None] = asyncio.Queue()
        self._splitter = IncrementalSplitter()
        self._carry = ""
        self._pending = 0
        """Characters queued in `_sentences`, not yet taken to be spoken."""
        self._ended = False
        self._first_text: float | None = None
        self._memory = MemoryTracker()

    async def open(self) -> tuple[Planner, SpeechJob, AudioOut]:
        """Read the options and check them on a probe sentence before anything is sent; return
        the sentence planner, the probe and the audio output."""
        options = await self.first(WsOptions)

        def plan(text: str) -> SpeechJob:
            return self.service.plan_options(options, text, self.request_id)

        probe = plan("Hello.")
        await self.ws.send_json(self.started(probe, options))
        out = AudioOut(self.ws, probe.sample_rate, options.format, options.binary)
        await out.header()
        return plan, probe, out

    def command(self, payload: dict[str, Any]) -> tuple[str, str]:
        """A fragment frame as (text, command); command is text, flush, end or cancel."""
        message = parse(WsTextMessage, payload)
        return message.text, message.type

    async def sentence_done(self, index: int, text: str, samples: int) -> None:
        await self.segment(index, text, samples)

    def final(self, stats: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "done",
            "request_id": self.request_id,
            "sentences": self.sentences,
            "stats": stats,
        }

    async def session(self) -> dict[str, Any]:
        plan, probe, out = await self.open()
        limit = min(probe.engine.capabilities.max_segment_chars, self.settings.max_input_chars)
        self._splitter = IncrementalSplitter(
            max_chars=limit, first_max_chars=self.settings.first_segment_chars
        )
        self.sample_rate = probe.sample_rate
        self.start_reader()
        pause = dsp.pause(probe.sample_rate, self.settings.sentence_pause_ms)
        synthesis_s = 0.0
        while (sentence := await self.wait(self._sentences.get())) is not None:
            self._pending -= len(sentence)
            job = plan(sentence)
            samples = await self.play(self.service.run(job), out, pause if self.sentences else None)
            synthesis_s += (job.stats.finished or time.perf_counter()) - job.stats.started
            self._memory.update()
            self.sentences += 1
            await self.sentence_done(self.sentences - 1, sentence, samples)
        return self.final(self._stats(synthesis_s))

    def _stats(self, synthesis_s: float) -> dict[str, Any]:
        audio_s = self.samples_sent / self.sample_rate
        ttfb = (
            round((self.first_audio - self._first_text) * 1000, 1)
            if self.first_audio is not None and self._first_text is not None
            else None
        )
        self._memory.finish()
        return {
            "t_total_ms": round((time.perf_counter() - self.opened) * 1000, 1),
            "ttfb_ms": ttfb,
            "audio_duration_ms": round(audio_s * 1000, 1),
            "rtf": round(synthesis_s / audio_s, 4) if audio_s else None,
            "segments": self.sentences,
            "mem": self._memory.envelope(),
        }

    async def listen(self) -> None:
        while True:
            text, command = self.command(await self.receive())
            if command == "cancel":
                return
            if self._ended:
                continue
            if text and self._first_text is None:
                self._first_text = time.perf_counter()
            pieces = self._splitter.feed(text) if text else []
            if command in ("flush", "end"):
                pieces += self._splitter.flush()
            for piece in pieces:
                self._queue(piece)
            if command == "end":
                self._ended = True
                self._sentences.put_nowait(None)

    def _queue(self, piece: str) -> None:
        """Queue a sentence; one with nothing to say waits to join the next (or is dropped).

        What waits is bounded, however much text arrives: the carried piece keeps at most what
        fits beside the next sentence in one segment, and queued text beyond
        `ws_max_pending_chars` ends the session (`TextBacklogFull`).
        """
        limit = self._splitter.max_chars
        room = limit - len(piece) - 1
        carry = self._carry[len(self._carry) - room:] if room > 0 else ""
        text = f"{carry} {piece}" if carry else piece
        if not _speakable(text):
            self._carry = text[-limit:]
            return
        self._carry = ""
        self._pending += len(text)
        if self._pending > self.settings.ws_max_pending_chars:
            raise TextBacklogFull(
                f"More than {self.settings.ws_max_pending_chars} characters are waiting to be "
                "spoken; send text no faster than it is spoken"
            )
        self._sentences.put_nowait(text)
