"""The cut-off between VoxMux and every speech backend.

Nothing above this package imports onnxruntime; nothing in it knows HTTP. An engine adapter is any
class that satisfies `Engine`; the registry owns its lifecycle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    voice: str
    speed: float = 1.0
    """Native speed factor, already clamped to `Capabilities.speed_range` by the caller."""
    language: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


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
        """Yield audio chunks in order; the first as early as possible."""

    def synthesize(self, req: SynthesisRequest) -> Audio: ...


def concatenate(chunks: Iterator[Audio] | list[Audio]) -> Audio:
    parts = list(chunks)
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate(parts).astype(np.float32, copy=False)


class VoxMuxError(Exception):
    """Base of every error VoxMux reports to a client; maps onto an OpenAI error body."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class InvalidParameter(VoxMuxError):
    """A request field has a value VoxMux or the engine cannot honour."""

    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class ModelNotFound(VoxMuxError):
    """No model or alias by that name."""

    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class VoiceNotFound(VoxMuxError):
    """The model has no voice by that name."""

    status = 404
    type = "invalid_request_error"
    code = "voice_not_found"


class EngineBusy(VoxMuxError):
    """The model is leased and the operation needs it idle."""

    status = 409
    type = "invalid_request_error"
    code = "model_busy"


class Overloaded(VoxMuxError):
    """Every slot and queue place for the model is taken."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"

    def __init__(self, message: str, *, retry_after: int = 1, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.retry_after = retry_after


class ModelLoading(VoxMuxError):
    """The model is still loading and the caller asked not to wait."""

    status = 503
    type = "server_error"
    code = "model_loading"


class LoadFailed(VoxMuxError):
    """The model's weights or runtime could not be loaded."""

    status = 503
    type = "server_error"
    code = "model_load_failed"


class SynthesisFailed(VoxMuxError):
    """The engine failed while producing audio."""

    status = 500
    type = "server_error"
    code = "synthesis_failed"


class RequestTimeout(VoxMuxError):
    """The request ran past its time limit."""

    status = 504
    type = "server_error"
    code = "timeout"


class Cancelled(VoxMuxError):
    """The request was cancelled by its client."""

    status = 499
    type = "invalid_request_error"
    code = "cancelled"
