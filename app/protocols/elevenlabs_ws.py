"""ElevenLabs' text-in WebSocket, `/v1/text-to-speech/{voice_id}/stream-input`, over VoxMux's
session loop (`app.protocols.websocket`).

The query names `model_id` and `output_format` (default `mp3_44100_128`). The first message
(beginning of stream) is `{"text": " ", "voice_settings", "generation_config", ...}`; then
`{"text": "...", "try_trigger_generation"?, "flush"?}` messages (LLM tokens), and `{"text": ""}`
ends the text. Each sentence is spoken once it is complete (`flush` speaks what is there now;
`generation_config.chunk_length_schedule` and `try_trigger_generation` are accepted and have no
effect: VoxMux cuts at sentences). The server sends `{"audio": base64, "isFinal": null,
"alignment", "normalizedAlignment"}` frames in the output format, the alignment (`chars`,
`charStartTimesMs`, `charsDurationsMs`, times from the start of the stream's audio) on the first
frame of each sentence, and at the end `{"isFinal": true}` (with the encoder's last audio), then
closes with 1000. A failure is `{"message", "error", "code"}` and a close.
"""

from __future__ import annotations

import base64
from typing import Any

from fastapi import WebSocket
from pydantic import BaseModel, ConfigDict

from app.audio.encoders import StreamEncoder
from app.http.auth import MESSAGE, Authenticator
from app.http.errors import InvalidApiKey, as_voxmux, kind_of
from app.protocols import elevenlabs as el
from app.protocols.timestamps import alignment
from app.protocols.websocket import AudioOut, Closing, Progress, Session
from app.serving.events import SegmentEnd, SegmentWords
from app.serving.job import SpeechJob
from app.serving.plan import SpeechPlan
from app.serving.service import SpeechService
from app.text.feed import TextFeed
from engines.base import Cancelled, InvalidParameter, TimedEngine


class BeginningOfStream(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str
    voice_settings: el.VoiceSettings | None = None
    generation_config: dict[str, Any] | None = None
    xi_api_key: str | None = None


class Options(BaseModel):
    """What the session is planned from: the path, the query and the first message."""

    voice_id: str
    model_id: str | None
    output_format: str | None
    language_code: str | None
    first: BeginningOfStream


class StreamInput:
    """The input mode: text messages until `{"text": ""}`. It keeps the text sent and not yet
    aligned (`spaces_before`), so the alignment carries the client's spaces between sentences."""

    def __init__(self, voice_id: str, query: dict[str, str], idle_timeout: float, *,
                 key_check: Authenticator | None = None) -> None:
        self.voice_id = voice_id
        self.query = query
        self.idle_timeout: float | None = idle_timeout
        self.key_check = key_check
        """Set when no key came with the handshake: the first message must carry one."""
        self._unaligned = ""
        self._pending = ""

    async def open(self, session: Session) -> tuple[BaseModel, str | None]:
        first = await session.first(BeginningOfStream)
        if self.key_check is not None and not self.key_check.match(first.xi_api_key):
            raise InvalidApiKey(MESSAGE)
        self._pending = first.text if first.text.strip() else ""
        self._unaligned = self._pending
        return Options(voice_id=self.voice_id, model_id=self.query.get("model_id"),
                       output_format=self.query.get("output_format"),
                       language_code=self.query.get("language_code"), first=first), None

    def message(self, payload: dict[str, Any], job: SpeechJob) -> None:
        feed = job.plan.text
        assert isinstance(feed, TextFeed)
        text = payload.get("text")
        if not isinstance(text, str):
            raise InvalidParameter("each message needs 'text' (a string; \"\" ends the text)",
                                   param="text")
        if feed.ended:
            raise InvalidParameter("the text has ended ({\"text\": \"\"} was sent): no more "
                                   "text is taken on this socket", param="text")
        self._feed_pending(feed)
        flush = payload.get("flush") is True
        if text == "" and not flush:
            feed.end()
            return
        self._unaligned += text
        feed.feed(text)
        if flush:
            feed.flush()

    def quiet(self, job: SpeechJob) -> None:
        feed = job.plan.text
        assert isinstance(feed, TextFeed)
        self._feed_pending(feed)  # a first message's text, then silence: it is spoken
        feed.end()

    def spaces_before(self, sentence: str) -> str | None:
        """The spaces sent before `sentence` (after the sentence before it), None if it is not
        next in the text sent; the text up to its end is then dropped, so only what is not
        spoken yet is kept."""
        found = self._unaligned.find(sentence)
        if found < 0 or self._unaligned[:found].strip():
            return None
        spaces, self._unaligned = self._unaligned[:found], self._unaligned[found + len(sentence):]
        return spaces

    def _feed_pending(self, feed: TextFeed) -> None:
        if self._pending:
            feed.feed(self._pending)
            self._pending = ""


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


class _EncodedOut(AudioOut):
    """Audio frames in the stream's output format, as ElevenLabs' JSON frames."""

    def __init__(self, ws: WebSocket, plan: SpeechPlan, out: el.OutputFormat,
                 framing: ElevenLabsFraming) -> None:
        super().__init__(ws, plan.sample_rate, as_json=framing.audio_frame)
        self._encoder = StreamEncoder(out.fmt, plan.sample_rate, out.rate, out.bit_rate)

    def tail(self) -> bytes:
        return self._encoder.finish()


class ElevenLabsFraming:
    text_in = True

    def __init__(self, source: StreamInput) -> None:
        self._source = source
        self._out: _EncodedOut | None = None
        self._format = el.output_format(None)
        self._alignment: dict[str, list[Any]] | None = None
        """The next sentence's characters, sent with its first audio frame."""

    async def plan(self, service: SpeechService, options: BaseModel, text: str | None,
                   request_id: str, client: str) -> SpeechPlan:
        assert isinstance(options, Options)
        self._format = el.output_format(options.output_format)
        body = el.TextToSpeech(text=" ", model_id=options.model_id,
                               voice_settings=options.first.voice_settings)
        chosen = el.target(service, options.voice_id, body)
        handle = service.registry.resolve(chosen.model)
        settings = options.first.voice_settings
        plan = service.plan_stream(
            model=chosen.model, voice=chosen.voice,
            speed=settings.speed if settings is not None and settings.speed else 1.0,
            language=options.language_code, request_id=request_id, client=client,
            timestamps=isinstance(handle.engine, TimedEngine))
        plan.warnings += chosen.warnings
        return plan

    def audio(self, ws: WebSocket, plan: SpeechPlan) -> AudioOut:
        self._out = _EncodedOut(ws, plan, self._format, self)
        return self._out

    def audio_frame(self, data: bytes) -> dict[str, Any]:
        aligned, self._alignment = self._alignment, None
        return {"audio": base64.b64encode(data).decode(), "isFinal": None,
                "normalizedAlignment": aligned, "alignment": aligned}

    def started(self, job: SpeechJob) -> None:
        return None

    def words(self, words: SegmentWords) -> None:
        chars = alignment(words.text, words.words)
        starts = chars["character_start_times_seconds"]
        ends = chars["character_end_times_seconds"]
        # The sentence is a stretch of the text sent, less the spaces around it: those before
        # it (after the last sentence) lead its characters, at its first character's time.
        gap = self._source.spaces_before(words.text)
        if gap:
            at = starts[0] if starts else 0.0
            chars["characters"][:0] = list(gap)
            starts[:0] = [at] * len(gap)
            ends[:0] = [at] * len(gap)
        self._alignment = {"chars": chars["characters"],
                           "charStartTimesMs": [_ms(s) for s in starts],
                           "charsDurationsMs": [_ms(e - s) for s, e in zip(starts, ends,
                                                                           strict=True)]}

    def segment(self, end: SegmentEnd) -> None:
        return None

    def keepalive(self, progress: Progress) -> None:
        return None

    def done(self, job: SpeechJob) -> dict[str, Any]:
        tail = self._out.tail() if self._out is not None else b""
        return {"audio": base64.b64encode(tail).decode() if tail else None, "isFinal": True}

    def failure(self, exc: BaseException, job: SpeechJob | None, audio_sent: bool) -> Closing:
        if isinstance(exc, Cancelled):
            return Closing({"isFinal": True}, 1000, "cancelled")
        kind = kind_of(exc)
        message = as_voxmux(exc).message
        frame = {"message": message, "error": as_voxmux(exc).code or kind.code,
                 "code": kind.status}
        reason = kind.breach or ("internal error" if kind.ws_close == 1011 else "error")
        return Closing(frame, 1008 if kind.status == 401 else kind.ws_close, reason)
