"""VoxMux in this process, for the commands that speak without a server: `voxmux say` and
`voxmux voices`.

`local_service(settings)` wires the catalogue, engines and `SpeechService` as `create_app` does
(no HTTP, no job runner, no preload: a model loads when the first request needs it); `speak`
runs one request through the same `plan` and `speak` as `POST /v1/audio/speech` and writes the
encoded audio as it is made.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from app.jobs.results import encoder
from app.serving.catalogue import Catalogue
from app.serving.events import SegmentEnd
from app.serving.service import SpeechService
from app.settings import Settings
from engines.frontend.detect import language_matches

FORMATS = {".mp3": "mp3", ".wav": "wav", ".flac": "flac", ".opus": "opus", ".ogg": "opus",
           ".aac": "aac", ".pcm": "pcm", ".raw": "pcm"}
"""Output formats by file suffix (`.ogg` is Opus in Ogg, as the speech route's `opus`)."""


@asynccontextmanager
async def local_service(settings: Settings) -> AsyncIterator[SpeechService]:
    """A speech service on this process's engines; its models unload when the block ends."""
    from app.serving.wiring import build_registry, runtime_options

    catalogue = Catalogue.load(settings.catalogue_path)
    registry = build_registry(settings, catalogue, runtime_options(settings))
    service = SpeechService(settings, registry, languages=catalogue.languages)
    try:
        yield service
    finally:
        service.close()
        await registry.close()
        await service.cache.close()


@dataclass(frozen=True)
class Output:
    """Where a command writes `path`: a regular file (or one not there yet) is written beside it
    (`.name.part`) and renamed once whole, so it is there whole or not at all; a device, a pipe
    or any other special file is written straight into (renaming over one replaced it: `-o
    /dev/null` made a regular file of /dev/null); a symbolic link is followed."""

    write: Path
    final: Path | None
    """What `write` is renamed to once whole; None when written in place."""

    @classmethod
    def of(cls, text: str) -> Output:
        """`ValueError` with a one-line reason when `text` cannot be written: checked before
        any audio is made, not after a whole book."""
        target = Path(text)
        real = target.resolve() if target.is_symlink() else target
        if real.is_dir():
            raise ValueError(f"{target} is a folder")
        if real.exists() and not real.is_file():
            return cls(real, None)
        if not real.parent.is_dir():
            raise ValueError(f"no such folder: {real.parent}")
        part = real.with_name(f".{real.name}.part")
        try:
            part.open("wb").close()
        except OSError as exc:
            raise ValueError(f"cannot write {target}: {exc.strerror or exc}") from None
        return cls(part, real)

    def done(self) -> None:
        if self.final is not None:
            self.write.replace(self.final)

    def drop(self) -> None:
        if self.final is not None:
            self.write.unlink(missing_ok=True)


@dataclass(frozen=True)
class Said:
    model: str
    voice: str
    seconds: float
    bytes: int


async def speak(service: SpeechService, out: BinaryIO, *, text: str, fmt: str,
                model: str, voice: str | None, speed: float, language: str | None,
                input_format: str | None,
                progress: Callable[[int, int], None] = lambda done, total: None) -> Said:
    """One request, planned and rendered as the speech route does it (SSML, lexicons, budgets
    and all), written to `out` as it is encoded; `progress(segments done, segments)`."""
    plan = await service.plan(model=model, text=text, voice=voice, speed=speed,
                              language=language, input_format=input_format,
                              request_id=f"cli_{uuid.uuid4().hex[:12]}", client="cli",
                              whole=True)
    job = service.speak(plan)
    written = samples = done = 0
    async with job:
        stream = encoder(fmt, job.sample_rate)
        progress(0, job.segments)
        async for event in job.events():
            if isinstance(event, np.ndarray):
                samples += len(event)
                data = await asyncio.to_thread(stream.encode, event)
            elif isinstance(event, SegmentEnd):
                done += 1
                progress(done, job.segments)
                continue
            else:
                continue
            written += await asyncio.to_thread(_write, out, data)
        written += await asyncio.to_thread(_write, out, stream.finish())
    return Said(plan.model_id, plan.voice, samples / job.sample_rate, written)


def _write(out: BinaryIO, data: bytes) -> int:
    out.write(data)
    out.flush()
    return len(data)


@dataclass(frozen=True)
class VoiceRow:
    model: str
    id: str
    name: str
    language: str
    gender: str | None


def voice_rows(service: SpeechService, model: str | None, language: str | None
               ) -> list[VoiceRow]:
    """The catalogue's voices, as `GET /v1/audio/voices` lists them (no model is loaded)."""
    handles = [service.registry.resolve(model)] if model else service.models()
    return [VoiceRow(h.id, v.id, v.name, v.language, v.gender)
            for h in handles for v in h.engine.voices()
            if not language or language_matches(v.language, language)]
