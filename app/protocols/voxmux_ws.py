"""VoxMux's WebSocket framing (`/ws/v1/tts`, `/ws/v1/tts/text`).

`started` first, then audio (binary int16 frames, or base64 `audio` JSON frames with
`binary: false`), a `segment` frame after each segment, `progress` keepalives while no audio
comes, and one final `done`, `error` or `cancelled` before the close. With `"timestamps":
"word"` a `words` frame comes before each segment's audio, and `cancelled` says which words the
audio sent before the cancel covered. Close codes: 1000 after a
final frame about the request itself (request errors included, like an HTTP 4xx answer); a
protocol breach or a server failure closes with the error table's code.

AngeVoice's clients read the same socket with other names: its JSON audio frames' `data`, `index`
(audio frame number) and `segment_index`, `started`'s `dtype` and
`recommended_prebuffer_seconds`, `done`'s `total_segments` and `total_audio_chunks`. Those fields
ride along in the same frames.
"""

from __future__ import annotations

from typing import Any

from fastapi import WebSocket
from pydantic import BaseModel

from app.http.errors import error_body, kind_of
from app.protocols.schemas import WsAudioFormat, WsOptions
from app.protocols.timestamps import word_json
from app.protocols.websocket import AudioOut, Closing, Progress, base64_frame
from app.serving.events import SegmentEnd, SegmentWords
from app.serving.job import SpeechJob
from app.serving.plan import SpeechPlan
from app.serving.service import SpeechService
from engines.base import Cancelled, WordTiming

PREBUFFER_SECONDS = 0.5
"""Audio a player should hold before it starts (AngeVoice's `recommended_prebuffer_seconds`):
audio comes a sentence at a time, each well ahead of real time on every embedded engine."""


class VoxMuxFraming:
    def __init__(self, *, text_in: bool) -> None:
        self.text_in = text_in
        self.format: WsAudioFormat = "pcm_s16le"
        self.binary = True
        self._out: AudioOut | None = None
        self._words: list[WordTiming] = []
        """Every word frame sent, for the `cancelled` frame."""
        self._segment_index = 0

    async def plan(self, service: SpeechService, options: BaseModel, text: str | None,
                   request_id: str, client: str) -> SpeechPlan:
        assert isinstance(options, WsOptions)
        self.format, self.binary = options.format, options.binary
        fields = options.plan_fields() | {"timestamps": options.timestamps == "word",
                                          "request_id": request_id, "client": client}
        if text is None:
            return service.plan_stream(**fields)
        return await service.plan(**fields, text=text)

    def audio(self, ws: WebSocket, plan: SpeechPlan) -> AudioOut:
        as_json = None if self.binary else self._json_audio
        self._out = AudioOut(ws, plan.sample_rate, self.format == "wav", as_json)
        return self._out

    def _json_audio(self, data: bytes) -> dict[str, Any]:
        frame = base64_frame(data)
        index = self._out.frames - 1 if self._out is not None else 0
        return frame | {"data": frame["audio"], "index": index,
                        "segment_index": self._segment_index}

    def started(self, job: SpeechJob) -> dict[str, Any]:
        plan = job.plan
        frame: dict[str, Any] = {
            "type": "started",
            "request_id": plan.request_id,
            "model": plan.model_id,
            "voice": plan.voice,
            "sample_rate": plan.sample_rate,
            "channels": 1,
            "format": self.format,
            "dtype": "int16",
            "recommended_prebuffer_seconds": PREBUFFER_SECONDS,
            "warnings": plan.warnings,
        }
        if not self.text_in:
            frame["segments"] = job.segments
        return frame

    def segment(self, end: SegmentEnd) -> dict[str, Any]:
        self._segment_index = end.index + 1
        return {"type": "segment", "index": end.index, "text": end.text, "samples": end.samples}

    def words(self, words: SegmentWords) -> dict[str, Any]:
        self._words += words.words
        return {"type": "words", "segment": words.index,
                "words": [word_json(w) for w in words.words]}

    def keepalive(self, progress: Progress) -> dict[str, Any]:
        return {"type": "progress", "elapsed_ms": progress.elapsed_ms,
                "segments_done": progress.segments_done, "audio_ms": progress.audio_ms}

    def done(self, job: SpeechJob) -> dict[str, Any]:
        assert job.stats is not None
        frame: dict[str, Any] = {"type": "done", "request_id": job.plan.request_id}
        if self.text_in:
            frame["sentences"] = job.segments
        frame["total_segments"] = job.segments
        frame["total_audio_chunks"] = self._out.frames if self._out is not None else 0
        return frame | {"stats": job.stats.envelope()}

    def failure(self, exc: BaseException, job: SpeechJob | None, audio_sent: bool) -> Closing:
        if isinstance(exc, Cancelled):
            return Closing(self._cancelled(job), 1000, "cancelled")
        kind = kind_of(exc)
        reason = kind.breach or ("internal error" if kind.ws_close == 1011 else "error")
        return Closing({"type": "error", **error_body(exc)}, kind.ws_close, reason)

    def _cancelled(self, job: SpeechJob | None) -> dict[str, Any]:
        """How much audio went out before the cancel, and (with timestamps) which words it
        covered: whole words in `words`, the one it cut into in `cut_word`."""
        frame: dict[str, Any] = {"type": "cancelled"}
        out = self._out
        if out is None:
            return frame
        audio_ms = round(out.samples_sent / out.sample_rate * 1000)
        frame |= {"samples_sent": out.samples_sent, "audio_ms": audio_ms}
        if job is not None and job.plan.timestamps:
            sent = [word_json(w) for w in self._words]  # compared as the client sees them
            heard = audio_ms / 1000
            frame["words"] = [w for w in sent if w["end"] <= heard]
            cut = [w for w in sent if w["start"] < heard < w["end"]]
            frame["cut_word"] = cut[0] if cut else None
        return frame
