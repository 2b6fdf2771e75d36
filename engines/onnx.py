"""onnxruntime session creation shared by the ONNX engines.

Sessions ask for the configured execution providers and report which ones they actually got, so
a CUDA request that silently fell back to CPU is visible to `/health`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

log = logging.getLogger(__name__)


@dataclass
class RuntimeOptions:
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int = 0
    """0 lets onnxruntime choose (one per physical core)."""
    inter_op_threads: int = 1
    fallbacks: list[str] = field(default_factory=list)
    """Human-readable notes of providers asked for but not obtained."""


def available_providers() -> list[str]:
    return list(ort.get_available_providers())


def runtime_version() -> str:
    return str(ort.__version__)


def open_session(model: Path | bytes, options: RuntimeOptions) -> Any:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = options.intra_op_threads
    opts.inter_op_num_threads = options.inter_op_threads
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Arena growth keeps RSS high after long inputs; releasing it matters for idle unload.
    opts.enable_cpu_mem_arena = False
    wanted = [p for p in options.providers if p in available_providers()]
    if "CPUExecutionProvider" not in wanted:
        wanted.append("CPUExecutionProvider")
    source = model if isinstance(model, bytes) else str(model)
    session = ort.InferenceSession(source, sess_options=opts, providers=wanted)
    got = session.get_providers()
    for asked in options.providers:
        if asked not in got:
            note = f"{asked} requested but not in use (session runs on {', '.join(got)})"
            if note not in options.fallbacks:
                options.fallbacks.append(note)
                log.warning(note)
    return session
