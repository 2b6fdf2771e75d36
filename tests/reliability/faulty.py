"""A test engine whose faults are switched on by its text and by a shared `Faults` object.

It is added the way a user adds an engine: a model in a catalogue that names the class by its
import path (see `faulty_catalogue`); VoxMux builds it with `FaultyEngine.from_settings`, which
hands it the `Faults` a test put in `FaultyEngine.faults_for_next` (see `faulty_engines`).
A segment containing `BOOM` raises; `HANG` blocks until the request is cancelled (as a
well-behaved engine stops when told) or `Faults.release` is set; `STUCK` blocks until
`Faults.release` whatever happens (an engine that cannot be interrupted); `SLOW` takes
`Faults.slow_seconds` and ignores cancels. `LOST` raises `EngineLost`, as a cluster's
renderer does when the engine replica dies during the call, while `Faults.losses` lasts.
`Faults.load_error` makes `load()` fail, `Faults.load_seconds` makes it slow. Every call counts
in `running`/`peak`, and an `unload()` while a call runs is recorded. Anything else is a short
tone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.resources import CONFIG
from engines.base import (
    Audio,
    Capabilities,
    EngineLost,
    SynthesisRequest,
    Voice,
    VoiceNotFound,
)
from tests.conftest import LiveServer, start_server, test_settings

RATE = 16_000
MODEL = "faulty"
VOICE = "tone"
SECONDS_PER_CHAR = 0.03


@dataclass
class Faults:
    load_error: str | None = None
    load_seconds: float = 0.0
    slow_seconds: float = 1.0
    release: threading.Event = field(default_factory=threading.Event)
    hung: threading.Event = field(default_factory=threading.Event)
    """Set once a `HANG` segment is blocked, so a test knows the hang has begun."""
    losses: int = 0
    """`LOST` segments left that raise `EngineLost` (each raise takes one)."""
    lost_calls: int = 0
    loads: int = 0
    running: int = 0
    """Engine calls running now; `peak` is the most there ever were at once."""
    peak: int = 0
    unloaded_while_running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset_counts(self) -> None:
        with self.lock:
            self.peak = self.running
            self.unloaded_while_running = 0


class FaultyEngine:
    name = MODEL
    sample_rate = RATE
    capabilities = Capabilities(speed_range=(0.5, 2.0), languages=("en",), max_segment_chars=400)

    faults_for_next: Faults | None = None

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._loaded = False

    @classmethod
    def from_settings(cls, settings: object, runtime: object) -> FaultyEngine:
        assert cls.faults_for_next is not None, "build it inside faulty_engines(faults)"
        return cls(cls.faults_for_next)

    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> None:
        self.faults.loads += 1
        time.sleep(self.faults.load_seconds)
        if self.faults.load_error:
            raise RuntimeError(self.faults.load_error)
        self._loaded = True

    def unload(self) -> None:
        with self.faults.lock:
            if self.faults.running:
                self.faults.unloaded_while_running += 1
        self._loaded = False

    def voices(self) -> list[Voice]:
        return [Voice(id=VOICE, name="Test tone", model=MODEL, language="en")]

    def validate(self, req: SynthesisRequest) -> None:
        if req.voice != VOICE:
            raise VoiceNotFound(f"The faulty engine has no voice '{req.voice}'", param="voice")

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        faults = self.faults
        with faults.lock:
            faults.running += 1
            faults.peak = max(faults.peak, faults.running)
        try:
            if "BOOM" in req.text:
                raise RuntimeError("injected fault")
            if "LOST" in req.text:
                with faults.lock:
                    faults.lost_calls += 1
                    lose, faults.losses = faults.losses > 0, max(0, faults.losses - 1)
                if lose:
                    raise EngineLost("The engine replica stopped: injected")
            if "HANG" in req.text:
                faults.hung.set()
                deadline = time.monotonic() + 60
                while not (req.cancel.wait(0.01) or faults.release.is_set()):
                    assert time.monotonic() < deadline, "a HANG was never released"
                req.cancel.check()
            if "STUCK" in req.text:
                faults.hung.set()
                faults.release.wait(60)
            if "SLOW" in req.text:
                time.sleep(faults.slow_seconds)
        finally:
            with faults.lock:
                faults.running -= 1
        yield tone(len(req.text) * SECONDS_PER_CHAR)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        return np.concatenate(list(self.stream(req)))


def tone(seconds: float) -> Audio:
    t = np.arange(int(RATE * seconds), dtype=np.float32) / RATE
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


def faulty_catalogue(tmp: Path) -> Path:
    """The shipped catalogue plus one `faulty` model, written under `tmp`."""
    shipped = (CONFIG / "models.toml").read_text(encoding="utf-8")
    extra = (f'\n[models.{MODEL}]\nengine = "{__name__}:FaultyEngine"\n'
             f'default_voice = "{VOICE}"\n')
    path = tmp / "models.toml"
    path.write_text(shipped + extra, encoding="utf-8")
    return path


def start_with_faulty(tmp: Path, faults: Faults, **overrides: Any) -> LiveServer:
    """A live server whose catalogue has the `faulty` model beside the real ones. One sentence
    is one segment there (no packing), so a test counts segments by its sentences."""
    overrides.setdefault("segment_growth", 1.0)
    settings = test_settings(tmp, catalogue=faulty_catalogue(tmp), **overrides)
    with faulty_engines(faults):  # engines are built inside create_app
        return start_server(settings)


@contextlib.contextmanager
def faulty_engines(faults: Faults) -> Iterator[None]:
    """The `faulty` engines built inside this block share `faults`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(FaultyEngine, "faults_for_next", faults)
        yield
