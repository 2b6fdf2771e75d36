"""The three things the harness compares, behind one call: `request(text) -> Sample`.

- `RawPiper`: VoxMux's own Piper adapter called in this process, on the text cut into the same
  segments VoxMux cuts it into, one `synthesize` per segment: the engine's cost and nothing else
  (no DSP, no pauses, no encoding, no HTTP). This is the limit VoxMux is measured against.
- `VoxMuxClient`: `POST /v1/audio/speech` (`response_format: pcm`) read as a stream.
- `PeerClient`: piper-tts's own server, `POST /synthesize`, one WAV when it is all done.

Every `request` may be called from several threads at once.
"""

from __future__ import annotations

import http.client
import json
import select
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from app.serving.wiring import runtime_options
from app.settings import Settings
from app.text.split import split_text
from engines.base import SynthesisRequest
from engines.piper import PiperEngine

WAV_HEADER = 44
"""piper-tts writes its WAV with Python's `wave` module: a plain 44-byte header."""


@dataclass(frozen=True)
class Sample:
    ttfa: float
    """Seconds until the first audio: the first segment (raw), the first body chunk (HTTP)."""
    total: float
    """Seconds until the whole response (raw: the last segment) is in."""
    audio_s: float
    """Seconds of audio delivered."""


class System(Protocol):
    name: str

    def request(self, text: str) -> Sample: ...


class RawPiper:
    name = "raw"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = PiperEngine(settings.models_dir / "piper", runtime_options(settings))
        self.engine.load()

    def segments(self, text: str) -> list[str]:
        return split_text(text, max_chars=self.engine.capabilities.max_segment_chars,
                          first_max_chars=self.settings.first_segment_chars,
                          growth=self.settings.segment_growth)

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        first = 0.0
        samples = 0
        for segment in self.segments(text):
            audio = self.engine.synthesize(SynthesisRequest(
                text=segment, voice=self.engine.default_voice, speed=1.0, language=None))
            samples += len(audio)
            first = first or time.perf_counter() - started
        return Sample(first, time.perf_counter() - started, samples / self.engine.sample_rate)

    def close(self) -> None:
        self.engine.unload()


class HttpSystem:
    """One keep-alive connection per calling thread, so concurrent workers never share a socket.

    The load generator shares the machine with the server it measures, so it is kept lean: the
    standard library's `http.client`, the body read in 64 KB blocks. httpx took 1.6 s of CPU for
    the bodies http.client reads in 0.15 s (64 five-sentence pcm responses, 8 at once), 2-3 % of
    this machine taken from the server being measured (docs/benchmarks.md)."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._local = threading.local()
        self._connections: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
            with self._lock:
                self._connections.append(conn)
        elif conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
            conn.close()  # the server closed the idle connection; the request reconnects
        return conn

    def post(self, path: str, payload: Mapping[str, object], started: float
             ) -> tuple[http.client.HTTPResponse, float, int]:
        """POST JSON and read the whole body: the response (headers), seconds from `started` to
        the first body bytes, and the body's size."""
        conn = self._connection()
        conn.request("POST", path, body=json.dumps(payload),
                     headers={"content-type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            detail = response.read()[:500].decode(errors="replace")
            raise RuntimeError(f"{path} answered {response.status}: {detail}")
        first = 0.0
        size = 0
        while block := response.read1(1 << 16):
            first = first or time.perf_counter() - started
            size += len(block)
        # A sized body read to its end with read1 leaves the response open, and the connection
        # then refuses its next request; closing it keeps the connection for the next one.
        response.close()
        return response, first, size

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()


MP3_BIT_RATE = 128_000
"""VoxMux's constant mp3 bit rate: its byte count gives the audio length."""


class VoxMuxClient(HttpSystem):
    def __init__(self, url: str, name: str = "voxmux", model: str = "piper",
                 fmt: str = "pcm") -> None:
        super().__init__(url)
        self.name = name
        self.model = model
        self.format = fmt

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        body = {"model": self.model, "input": text, "response_format": self.format}
        response, first, size = self.post("/v1/audio/speech", body, started)
        rate = int(response.headers["x-sample-rate"])
        audio_s = size * 8 / MP3_BIT_RATE if self.format == "mp3" else size / 2 / rate
        return Sample(first, time.perf_counter() - started, audio_s)


class PeerClient(HttpSystem):
    name = "peer"

    def __init__(self, url: str, sample_rate: int) -> None:
        super().__init__(url)
        self.sample_rate = sample_rate

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        _, first, size = self.post("/synthesize", {"text": text}, started)
        return Sample(first, time.perf_counter() - started,
                      (size - WAV_HEADER) / 2 / self.sample_rate)
