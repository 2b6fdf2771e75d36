"""LunaVox's WebSocket protocol on VoxMux's sessions: `WS /v1/stream` and `WS /v1/stream/text`.

The server sends int16 little-endian mono PCM in binary frames at the engine's rate, then one
text frame `{"done": true, "sample_rate", "stats"}` (the text route adds `sentences`) and closes
with 1000. Nothing else is a text frame: no `started`, no keepalives, since a LunaVox client
takes any text frame for the last one. A bad request (bad JSON, unknown field, model or voice, a
mode no engine serves) closes with 1003 and the reason, before any audio; a failure once audio
is flowing, or one that is not the request's fault, sends `{"error": "..."}` and then closes
(1003 bad request, 1013 overloaded, 1011 otherwise). Protocol limits close with their own code
(1008, 1009, 1013) and no frame.
"""

from __future__ import annotations

from typing import Any

from app.protocols import lunavox
from app.protocols.lunavox import VoiceChoice
from app.protocols.schemas import StreamFragment, StreamRequest, SynthOptions
from app.protocols.websocket import (
    AudioOut,
    ClientCancel,
    CloseCode,
    Planner,
    Session,
    SessionError,
    TextSession,
    parse,
)
from app.serving.service import SpeechJob
from engines.base import Cancelled, Overloaded, VoxMuxError

_BAD_REQUEST = frozenset({400, 404, 413, 422})


class LunaVoxSession(Session):
    """LunaVox's framing around the audio: no keepalives, `{"error"}` frames, 1003 refusals."""

    choice = VoiceChoice("base", None, ())

    def keepalive(self) -> dict[str, Any] | None:
        return None

    async def fail(self, exc: Exception) -> None:
        if isinstance(exc, SessionError):
            await self._finish(None, exc.close_code, exc.message)
            return
        if isinstance(exc, ClientCancel | Cancelled):
            cancelled = {"error": "The request was cancelled"}
            await self._finish(cancelled, CloseCode.NORMAL, "cancelled")
            return
        bad = isinstance(exc, VoxMuxError) and exc.status in _BAD_REQUEST
        message = exc.message if isinstance(exc, VoxMuxError) else f"The session failed: {exc}"
        if bad and not self.samples_sent:
            await self._finish(None, CloseCode.UNSUPPORTED_DATA, message)
            return
        code = (
            CloseCode.UNSUPPORTED_DATA if bad
            else CloseCode.TRY_AGAIN_LATER if isinstance(exc, Overloaded)
            else CloseCode.INTERNAL_ERROR
        )
        await self._finish({"error": message}, code, message)

    def plan(self, options: SynthOptions, text: str) -> SpeechJob:
        job, self.choice = lunavox.plan(self.service, options, text, self.request_id)
        self.sample_rate = job.sample_rate
        return job

    def done(self, stats: dict[str, Any], **extra: Any) -> dict[str, Any]:
        frame = {"done": True, "sample_rate": self.sample_rate, **extra}
        return frame | {"stats": lunavox.stats(stats, self.choice.ignored)}


class StreamSession(LunaVoxSession):
    """`WS /v1/stream`: one request frame, its audio, `done`."""

    async def session(self) -> dict[str, Any]:
        request = await self.first(StreamRequest)
        job = self.plan(request, request.input)
        self.start_reader()
        await self.play(self.service.run(job), AudioOut(self.ws, job.sample_rate))
        return self.done(job.stats.envelope(job.sample_rate, len(job.segments)))

    async def listen(self) -> None:
        while True:  # LunaVox defines nothing after the request; read to see a disconnect
            await self.receive()


class TextStreamSession(LunaVoxSession, TextSession):
    """`WS /v1/stream/text`: an init frame, `{"text"}` fragments, `{"end": true}`."""

    async def open(self) -> tuple[Planner, SpeechJob, AudioOut]:
        options = await self.first(SynthOptions)
        probe = self.plan(options, "Hello.")
        return (lambda text: self.plan(options, text)), probe, AudioOut(self.ws, probe.sample_rate)

    def command(self, payload: dict[str, Any]) -> tuple[str, str]:
        fragment = parse(StreamFragment, payload)
        return fragment.text, "end" if fragment.end else "text"

    async def sentence_done(self, index: int, text: str, samples: int) -> None:
        return None

    def final(self, stats: dict[str, Any]) -> dict[str, Any]:
        return self.done(stats, sentences=self.sentences)
