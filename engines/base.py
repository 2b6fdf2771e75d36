"""The cut-off between VoxMux and every speech backend.

Nothing above this package imports onnxruntime; nothing in it knows HTTP. An engine adapter is any
class that satisfies `Engine`; the registry owns its lifecycle.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Audio = npt.NDArray[np.float32]
"""Mono float32 samples in [-1, 1] at the engine's sample rate."""


@dataclass(frozen=True)
class Voice:
    id: str
    name: str
    model: str
    language: str = ""
    gender: str = ""
    """`female`, `male` or empty where unknown."""


@dataclass(frozen=True)
class Capabilities:
    speed_range: tuple[float, float] = (0.5, 2.0)
    """Speeds the engine honours natively; VoxMux time-stretches outside this range."""
    languages: tuple[str, ...] = ()
    streaming: bool = True
    voice_blending: bool = False
    multi_speaker: bool = False
    max_segment_chars: int = 400
    """Longest text piece the engine is handed at once; longer text is split before it."""
    neural: bool = True
    """A neural model. False for rule-based synthesis such as eSpeak NG's formant voices: they
    cover many languages but sound robotic, so the Studio lists neural voices first."""
    whole_first_sentence: bool = False
    """Never cut a stream's first sentence short for early audio: for an engine that makes a
    sentence in a few tens of milliseconds the cut gains nothing and costs a call (the silence
    it renders at either end, 5 % of hibari's work on five sentences) and the sentence's tune."""
    cores_per_call: int = 0
    """Cores one engine call keeps busy: 0 for every core (onnxruntime spreads an inference over
    them), n for an engine whose calls cannot use more (a graph too small to split, work on the
    host between inferences). Each of a model's `VOXMUX_CONCURRENCY` turns is then
    `cores / cores_per_call` turns, so its lane keeps every core busy as one call of a
    many-threaded engine does (`lane_concurrency`)."""
    batching: bool = False
    """Its graph can take segments of several requests in one run (`engines.batching`): with
    batching on, its lane lets that many calls in at once, so that they can meet."""
    instances: int = 1
    """Sessions of its graph that run calls at once (`VOXMUX_INSTANCES`,
    `engines.onnx.SessionPool`): its lane lets at least that many calls in, so that each has
    one to run."""


def lane_concurrency(concurrency: int, capabilities: Capabilities, cores: int,
                     batch: int = 1) -> int:
    """Engine calls at once on a model's lane: `concurrency` calls that use every core each, or
    as many more as fill the `cores` with calls that use `cores_per_call` each; for an engine
    that batches, at least `batch`; for one with several instances, at least one per instance."""
    turns = concurrency
    if capabilities.cores_per_call > 0:
        turns = concurrency * max(1, cores // capabilities.cores_per_call)
    if capabilities.batching:
        turns = max(turns, batch)
    return max(turns, capabilities.instances)


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    voice: str
    speed: float = 1.0
    """Native speed factor, already clamped to `Capabilities.speed_range` by the caller."""
    language: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    cancel: CancelToken = field(default_factory=lambda: CancelToken(), compare=False)
    """Set when the request is cancelled; engines stop at their next step (see `CancelToken`)."""
    timings: bool = False
    """Whether the caller wants word timings (`TimedEngine`); without it none are computed."""


@dataclass(frozen=True)
class WordTiming:
    """When one word of the request text is heard.

    Times are seconds from the start of the audio they come with; `char_start`/`char_end` are the
    word's span in the request text (a number written "42" is one word spoken as "forty-two").
    """

    word: str
    start: float
    end: float
    char_start: int
    char_end: int
    char_times: tuple[float, ...] = ()
    """Boundaries of the word's characters: `len(word) + 1` times from `start` to `end`,
    interpolated along the word's phonemes; empty where unknown (spread evenly)."""

    def moved(self, *, scale: float = 1.0, shift: float = 0.0, chars: int = 0,
              low: float = 0.0, high: float = float("inf")) -> WordTiming:
        """Times scaled, then shifted and kept inside [low, high]; the span moved by `chars`."""
        def at(t: float) -> float:
            return min(max(t * scale + shift, low), high)
        return WordTiming(self.word, at(self.start), at(self.end), self.char_start + chars,
                          self.char_end + chars, tuple(at(t) for t in self.char_times))

    def character_times(self) -> list[tuple[float, float]]:
        """(start, end) of each character of `word`."""
        bounds = self.char_times
        n = len(self.word)
        if len(bounds) != n + 1:
            step = (self.end - self.start) / max(n, 1)
            bounds = tuple(self.start + step * i for i in range(n + 1))
        return [(bounds[i], bounds[i + 1]) for i in range(n)]


@dataclass(frozen=True)
class TimedAudio:
    """One chunk of audio and the words heard in it (times from the chunk's first sample)."""

    audio: Audio
    words: tuple[WordTiming, ...] = ()


class EngineSettings(Protocol):
    """What every engine may read of VoxMux's settings in `from_settings` (an engine may read
    more fields of its own, with a default where they are missing)."""

    models_dir: Path
    """User model files, one folder per model (`models/<engine>/`)."""
    cache_dir: Path
    """Writable: assembled weights, graphs edited for timings."""


@runtime_checkable
class Engine(Protocol):
    name: str
    sample_rate: int
    capabilities: Capabilities

    @property
    def loaded(self) -> bool: ...

    def load(self) -> None:
        """Make the engine ready to synthesize; blocking; raises `LoadFailed`."""

    def unload(self) -> None:
        """Free the engine's resources; idempotent."""

    def voices(self) -> list[Voice]: ...

    def validate(self, req: SynthesisRequest) -> None:
        """Raise a `VoxMuxError` for a request the engine cannot serve, before any audio."""

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        """Yield audio chunks in order; the first as early as possible. Stops with `Cancelled`
        soon after `req.cancel` is set, inside a running inference where the runtime allows."""

    def synthesize(self, req: SynthesisRequest) -> Audio: ...

    # An engine class also has `from_settings(settings: EngineSettings, runtime:
    # engines.onnx.RuntimeOptions) -> Self`, a classmethod: the catalogue names the class by its
    # import path and VoxMux builds it through that (`engines.plugin`).


@runtime_checkable
class TimedEngine(Protocol):
    """An engine that can say when each word is heard. Optional: the serving core uses it when
    an engine has it, and refuses timestamp requests (400) for engines without it."""

    def stream_timed(self, req: SynthesisRequest) -> Iterator[TimedAudio]:
        """`stream`, each chunk with its words when `req.timings` (else `words` is empty)."""


@runtime_checkable
class Placed(Protocol):
    """An engine whose work runs on an onnxruntime execution provider. Optional: the status
    routes say which provider each model really runs on (CUDA, or the CPU it fell back to);
    an engine without it (eSpeak NG) runs on the host CPU and reports nothing."""

    def providers(self) -> tuple[str, ...]:
        """The providers its open sessions run on, in onnxruntime's order of preference
        (`get_providers()`, union over its sessions); empty while unloaded."""


@dataclass(frozen=True)
class Instances:
    """The sessions a loaded engine runs its calls on (`Pooled`)."""

    count: int
    """Sessions of its graph (of each graph, for an engine with one per voice)."""
    busy: tuple[int, ...] = ()
    """Calls running on each session now (the first graph's, for an engine with several)."""
    vram_mib: float | None = None
    """Device memory one session took as it opened, where it runs on CUDA and NVML can tell."""
    vram_note: str = ""
    """Why `vram_mib` is None."""


@runtime_checkable
class Pooled(Protocol):
    """An engine that runs its calls on a pool of sessions (`engines.onnx.SessionPool`).
    Optional: `/health` says how many instances each model runs and their VRAM."""

    def instances(self) -> Instances | None:
        """Its sessions now; None while unloaded."""


@runtime_checkable
class Fingerprinted(Protocol):
    """An engine that names what a voice's audio is made from. Optional, but without it the audio
    cache cannot tell that a voice's files changed: it keys such an engine by its name only."""

    def fingerprint(self, voice: str) -> str:
        """A short digest (`engines.signature`) of the weights, voice data and phonemizer
        versions `voice` is rendered with, that changes whenever they do; digests of content, so
        that machines with the same files agree. Cheap: called on the event loop per request."""


def concatenate(chunks: Iterator[Audio] | list[Audio]) -> Audio:
    parts = list(chunks)
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(parts).astype(np.float32, copy=False)


_ABSOLUTE_PATH = re.compile(r"(?<![\w:/.~-])/(?:[\w.@+~-]+/)+([\w.@+~-]*)")


def public_text(text: str) -> str:
    """`text` with every absolute file path cut to its file name: libraries put the paths of
    the files they failed on in their messages, and those messages reach clients."""
    return _ABSOLUTE_PATH.sub(lambda m: m[1] or "/", text)


def describe(exc: BaseException) -> str:
    """`Type: message` of a library's exception, fit for a client (no server paths)."""
    return public_text(f"{type(exc).__name__}: {exc}")


class VoxMuxError(Exception):
    """Base of every error VoxMux reports to a client.

    Errors say what went wrong and which request field it concerns (`param`); how each class
    reaches a client (HTTP status, OpenAI type and code, WebSocket close codes) is decided in one
    table at the edge, `app.http.errors`. `code` overrides that table's code for one instance.
    """

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        message = public_text(message)  # often carries a library's message, paths and all
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class InvalidParameter(VoxMuxError):
    """A request field has a value VoxMux or the engine cannot honour."""


class ModelNotFound(VoxMuxError):
    """No model or alias by that name."""


class VoiceNotFound(VoxMuxError):
    """The model has no voice by that name."""


class EngineBusy(VoxMuxError):
    """The model is leased, loading or being switched to, and the operation needs it idle."""


class Overloaded(VoxMuxError):
    """Every slot and queue place for the model is taken."""

    def __init__(self, message: str, *, retry_after: int = 1, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class LoadFailed(VoxMuxError):
    """The model's weights or runtime could not be loaded."""


class SynthesisFailed(VoxMuxError):
    """The engine failed while producing audio."""


class EngineLost(SynthesisFailed):
    """The process running the engine call stopped during it (a cluster's engine replica died,
    or its node went): the call may be what ended it."""


class RequestTimeout(VoxMuxError):
    """The request made no progress within its time limit."""


class Cancelled(VoxMuxError):
    """The request was cancelled (by its client, a disconnect or a timeout)."""


class CancelToken:
    """Stops one request's engine work from another thread.

    The serving layer calls `cancel()`; an engine checks `cancelled` between steps and registers
    `on_cancel` hooks that reach into a running call (onnxruntime's `RunOptions.terminate`, a
    synth callback that returns "abort"). A hook registered after the cancel runs at once.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._hooks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            hooks, self._hooks = self._hooks, []
        for hook in hooks:
            hook()

    def on_cancel(self, hook: Callable[[], None]) -> Callable[[], None]:
        """Run `hook` when cancelled; returns a function that unregisters it."""
        with self._lock:
            if not self._event.is_set():
                self._hooks.append(hook)
                return lambda: self._forget(hook)
        hook()
        return lambda: None

    def _forget(self, hook: Callable[[], None]) -> None:
        with self._lock:
            if hook in self._hooks:
                self._hooks.remove(hook)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until cancelled or `timeout`; True if cancelled."""
        return self._event.wait(timeout)

    def check(self) -> None:
        """Raise `Cancelled` if the request was cancelled."""
        if self._event.is_set():
            raise Cancelled("The request was cancelled")
