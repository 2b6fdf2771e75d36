"""A float32 ONNX graph in float16, through `onnxconverter-common`, with chosen nodes kept float32.

The converter turns every float tensor and weight to float16 and wraps each node it is told to
keep (by op type or name) in casts to float32 and back. Four of its habits break a graph like
Kokoro's, so this module works around them before and after it runs:
- it reads a Cast's target as the node's first attribute, and an exported Cast's first attribute
  may be `saturate` (which only matters for float8): those are dropped;
- a graph output that nodes inside the graph also read gets its producer renamed, so those
  readers see float32 where they were given float16: each output gets a node of its own;
- a weight read by a kept node stays float32 for every reader, also the float16 ones: such a
  weight is copied for the kept nodes;
- a value passing from one kept node to the next goes through float16 and back (tiny spectral
  values became 0, and 0/0 NaN, in Kokoro's vocoder), and a Cast to float inside the converted
  part still casts to float32: round trips are removed and those casts retargeted.
Graph inputs and outputs keep their float32 type, so callers feed and read what they did.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Collection, Iterable
from types import ModuleType

import onnx
from onnx import TensorProto, helper

KEPT_BY_DEFAULT = ("Range", "CumSum", "Resize", "Upsample", "Min", "Max", "TopK",
                   "NonMaxSuppression", "RoiAlign", "RandomUniformLike")
"""Op types the converter keeps in float32 unless told otherwise (its defaults for ops outside
classic ML): counts, indices and coordinates that float16 would round."""


MOVERS = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten",
                    "Expand", "Slice", "Gather", "Concat", "Split", "Pad", "Tile"})
"""Ops that only move or copy values: one fed by kept nodes alone is kept too, else a value
would pass through float16 between two kept nodes (a transpose onnxruntime's exporter left
between Kokoro's phase sum and its resampling carried 86926, beyond float16's 65504)."""


class MissingConverter(RuntimeError):
    """`onnxconverter-common`, which makes float16 graphs, is not installed."""


def _converter() -> ModuleType:
    try:
        float16 = importlib.import_module("onnxconverter_common.float16")
    except ImportError as exc:
        raise MissingConverter(
            "float16 graphs need the onnxconverter-common package "
            "(pip install 'voxmux[gpu]' or pip install onnxconverter-common)") from exc
    return float16


def _drop_saturate(graph: onnx.GraphProto) -> None:
    for node in graph.node:
        if node.op_type == "Cast":
            kept = [a for a in node.attribute if a.name != "saturate"]
            del node.attribute[:]
            node.attribute.extend(kept)


def _own_output_nodes(graph: onnx.GraphProto) -> None:
    """Every graph output written by an Identity nobody else reads, the tensor the graph uses
    inside renamed."""
    outputs = {o.name for o in graph.output}
    inner = {name: f"{name}.inner" for name in outputs}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in inner:
                node.input[i] = inner[name]
        for i, name in enumerate(node.output):
            if name in inner:
                node.output[i] = inner[name]
    graph.node.extend(helper.make_node("Identity", [inner[o.name]], [o.name], name=f"{o.name}.out")
                      for o in graph.output)


def _float_outputs(model: onnx.ModelProto) -> None:
    """Give untyped float outputs (an inner tensor made an output) their type: the converter
    only keeps float32 outputs it knows to be float."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    for output in model.graph.output:
        if not output.type.tensor_type.elem_type:
            elem = types.get(f"{output.name}.inner") or types.get(output.name)
            if elem:
                output.type.tensor_type.elem_type = elem


def _with_movers(graph: onnx.GraphProto, kept: set[str]) -> set[str]:
    """`kept` plus the movers (in graph order) whose computed inputs all come from kept nodes."""
    weights = {t.name for t in graph.initializer}
    producer = {name: node for node in graph.node for name in node.output}
    kept = set(kept)
    for node in graph.node:
        if node.op_type not in MOVERS or node.name in kept:
            continue
        sources = [producer[name] for name in node.input
                   if name and name not in weights and name in producer]
        if sources and all(s.name in kept for s in sources):
            kept.add(node.name)
    return kept


def _own_kept_weights(graph: onnx.GraphProto, kept: set[str]) -> None:
    """A copy of each float weight that kept and converted nodes share, read by the kept ones."""
    readers: dict[str, set[bool]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.name in kept)
    shared = {t.name: t for t in graph.initializer
              if t.data_type == TensorProto.FLOAT and readers.get(t.name) == {True, False}}
    for name, tensor in shared.items():
        copy = TensorProto()
        copy.CopyFrom(tensor)
        copy.name = f"{name}.fp32"
        graph.initializer.append(copy)
    for node in graph.node:
        if node.name in kept:
            for i, name in enumerate(node.input):
                if name in shared:
                    node.input[i] = f"{name}.fp32"


def _cast_target(node: onnx.NodeProto) -> int:
    return next(int(a.i) for a in node.attribute if a.name == "to")


def _retarget_casts(graph: onnx.GraphProto) -> None:
    """A Cast to float32 whose result the converter typed float16 (its readers are float16)
    casts to float16."""
    halves = {v.name for v in graph.value_info
              if v.type.tensor_type.elem_type == TensorProto.FLOAT16}
    for node in graph.node:
        if node.op_type == "Cast" and _cast_target(node) == TensorProto.FLOAT \
                and node.output[0] in halves:
            for attribute in node.attribute:
                if attribute.name == "to":
                    attribute.i = TensorProto.FLOAT16


def _fold_round_trips(graph: onnx.GraphProto) -> None:
    """float32 -> Cast(float16) -> Cast(float32) becomes the float32 value itself."""
    floats = {v.name for v in graph.value_info
              if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    producer = {name: node for node in graph.node for name in node.output}
    outputs = {o.name for o in graph.output}
    instead: dict[str, str] = {}
    for node in graph.node:
        if node.op_type != "Cast" or _cast_target(node) != TensorProto.FLOAT \
                or node.output[0] in outputs:
            continue
        half = producer.get(node.input[0])
        if half is not None and half.op_type == "Cast" \
                and _cast_target(half) == TensorProto.FLOAT16 and half.input[0] in floats:
            instead[node.output[0]] = half.input[0]
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in instead:
                node.input[i] = instead[name]
    read = {name for node in graph.node for name in node.input} | outputs
    live = [n for n in graph.node if n.op_type != "Cast" or n.output[0] in read]
    del graph.node[:]
    graph.node.extend(live)


def to_float16(model: onnx.ModelProto, keep_ops: Iterable[str] = (),
               keep_nodes: Collection[str] = ()) -> onnx.ModelProto:
    """`model` (float32, changed in place) converted to float16, except nodes of the op types
    `keep_ops` (besides KEPT_BY_DEFAULT) and the nodes named in `keep_nodes`.

    Raises MissingConverter without `onnxconverter-common`."""
    float16 = _converter()
    graph = model.graph
    ops = set(KEPT_BY_DEFAULT) | set(keep_ops)
    kept = _with_movers(graph, {n.name for n in graph.node
                                if n.op_type in ops or n.name in keep_nodes})
    _drop_saturate(graph)
    _own_output_nodes(graph)
    _float_outputs(model)
    _own_kept_weights(graph, kept)
    with warnings.catch_warnings():
        # It warns for each weight it clamps into [1e-7, 1e4]: Kokoro's attention mask (-3.4e38)
        # and one Snake coefficient (-10553) among them, measured harmless (the tests listen).
        warnings.simplefilter("ignore", UserWarning)
        converted: onnx.ModelProto = float16.convert_float_to_float16(
            model, keep_io_types=True, op_block_list=sorted(ops), node_block_list=sorted(kept))
    graph = converted.graph
    outputs = {o.name for o in graph.output}
    # The converter records graph outputs as inner values too, typed float16: forget them.
    kept_info = [v for v in graph.value_info if v.name not in outputs]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    _retarget_casts(graph)
    _fold_round_trips(graph)
    return converted
