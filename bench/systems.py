"""The three things the harness compares, behind one call: `request(text) -> Sample`.

- `RawPiper`: VoxMux's own Piper adapter called in this process, on the text cut into the same
  segments VoxMux cuts it into, one `synthesize` per segment: the engine's cost and nothing else
  (no DSP, no pauses, no encoding, no HTTP). This is the limit VoxMux is measured against.
- `VoxMuxClient`: `POST /v1/audio/speech` (`response_format: pcm`) read as a stream.
- `PeerClient`: piper-tts's own server, `POST /synthesize`, one WAV when it is all done.

Every `request` may be called from several threads at once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Protocol

import httpx

from app.main import runtime_options
from app.settings import Settings
from app.textsplit import split_text
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
                          first_max_chars=self.settings.first_segment_chars)

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


class _HttpSystem:
    """One keep-alive client per calling thread, so concurrent workers never share a socket."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = httpx.Client(base_url=self.url, timeout=600)
            with self._lock:
                self._clients.append(client)
        return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients:
                client.close()
            self._clients.clear()


MP3_BIT_RATE = 128_000
"""VoxMux's constant mp3 bit rate: its byte count gives the audio length."""


class VoxMuxClient(_HttpSystem):
    def __init__(self, url: str, name: str = "voxmux", model: str = "piper",
                 fmt: str = "pcm") -> None:
        super().__init__(url)
        self.name = name
        self.model = model
        self.format = fmt

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        first = 0.0
        size = 0
        body = {"model": self.model, "input": text, "response_format": self.format}
        with self.client().stream("POST", "/v1/audio/speech", json=body) as response:
            response.raise_for_status()
            rate = int(response.headers["x-sample-rate"])
            for chunk in response.iter_raw():
                if chunk and not first:
                    first = time.perf_counter() - started
                size += len(chunk)
        audio_s = size * 8 / MP3_BIT_RATE if self.format == "mp3" else size / 2 / rate
        return Sample(first, time.perf_counter() - started, audio_s)


class PeerClient(_HttpSystem):
    name = "peer"

    def __init__(self, url: str, sample_rate: int) -> None:
        super().__init__(url)
        self.sample_rate = sample_rate

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        first = 0.0
        size = 0
        with self.client().stream("POST", "/synthesize", json={"text": text}) as response:
            response.raise_for_status()
            for chunk in response.iter_raw():
                if chunk and not first:
                    first = time.perf_counter() - started
                size += len(chunk)
        return Sample(first, time.perf_counter() - started,
                      (size - WAV_HEADER) / 2 / self.sample_rate)
