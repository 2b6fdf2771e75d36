"""Kokoro's float graphs (fp32, fp16), built once from the timed int8 graph into the cache dir.

The published Kokoro graph is dynamically quantized; CUDA lacks kernels for its integer ops, so
a GPU serves a float graph: the int8 one with its weights dequantized (`engines.dequantize`),
optionally in float16 (`engines.float16`) with the vocoder's signal generation kept in float32.
The timed outputs (the durations tensor) keep their names, so timings work the same.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from engines.base import LoadFailed
from engines.onnx import writing

if TYPE_CHECKING:  # onnx is imported when a float graph is built, not to plan or list voices
    import onnx

Precision = Literal["int8", "fp32", "fp16"]
PRECISIONS: tuple[Precision, ...] = ("int8", "fp32", "fp16")

KEEP_FP32 = (
    re.compile(r"/decoder/decoder/generator/m_source/"),
    re.compile(r"/decoder/decoder/generator/[^/]+$"),
)
"""Nodes (by name) the fp16 graph computes in float32, chosen by listening and measuring:
the harmonic source sums the phase of every sample (it reached 86926, past float16's 65504:
NaN audio), and the generator's own nodes take the STFT of that source and turn the vocoder's
output into magnitude and phase (atan2 of small spectra in float16 gave NaN). Everything else
(text encoder, ALBERT, prosody predictor, decoder blocks, the iSTFT) holds in float16: its audio
is closer to the fp32 graph's than the int8 graph's is, and the durations are equal."""


@functools.cache
def recipe() -> str:
    """What the built graphs depend on besides the int8 one: this module, the two passes and the
    converter's version. Part of each graph's stamp, so a change to any of them rebuilds it."""
    digest = hashlib.sha256()
    for module in ("kokoro_float.py", "dequantize.py", "float16.py"):
        digest.update(Path(__file__).with_name(module).read_bytes())
    with contextlib.suppress(metadata.PackageNotFoundError):  # fp16 fails without it anyway
        digest.update(metadata.version("onnxconverter-common").encode())
    return digest.hexdigest()[:16]


def graph_file(precision: Precision) -> str:
    return f"kokoro-v1.0.{precision}.timed.onnx"


def _marker(target: Path) -> Path:
    return target.with_name(target.name + ".stamp")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def intact(target: Path) -> bool:
    """Whether `target` still has the sha256 recorded when it was built (a full read)."""
    marker = _marker(target)
    if not (target.exists() and marker.exists()):
        return False
    return marker.read_text().split("\n")[2:3] == [_sha256(target)]


def _build_once(target: Path, stamp: str, build: Callable[[], onnx.ModelProto]) -> Path:
    """`target` made by `build` unless one with the same stamp and size is there (the size is
    checked on every load, a cut-off copy fails it; the sha256 is recorded for `intact`).
    Written beside it and renamed, so a reader never sees half a file."""
    marker = _marker(target)
    if target.exists() and marker.exists():
        recorded = marker.read_text().split("\n")
        if recorded[:2] == [stamp, str(target.stat().st_size)]:
            return target
    import onnx

    model = build()
    with writing(target) as partial:
        onnx.save(model, str(partial))
        del model
        digest = _sha256(partial)
    marker.write_text(f"{stamp}\n{target.stat().st_size}\n{digest}\n")
    return target


def float_graph(timed: Path, stamp: str, precision: Precision) -> Path:
    """The timed int8 graph `timed` (identified by `stamp`) in `precision`, built once beside
    it. fp16 needs `onnxconverter-common` (the `gpu` extra)."""
    if precision == "int8":
        return timed
    import onnx

    from engines.dequantize import UnknownPattern, dequantize
    from engines.float16 import MissingConverter, to_float16

    fp32 = timed.with_name(graph_file("fp32"))
    try:
        _build_once(fp32, f"{stamp} {recipe()} fp32",
                    lambda: dequantize(onnx.load(str(timed))))
        if precision == "fp32":
            return fp32

        def build16() -> onnx.ModelProto:
            model = onnx.load(str(fp32))
            keep = [n.name for n in model.graph.node if any(p.match(n.name) for p in KEEP_FP32)]
            return to_float16(model, keep_nodes=keep)

        return _build_once(timed.with_name(graph_file("fp16")), f"{stamp} {recipe()} fp16",
                           build16)
    except (UnknownPattern, MissingConverter) as exc:
        raise LoadFailed(f"Kokoro {precision} graph cannot be built: {exc}") from exc
