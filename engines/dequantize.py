"""A dynamically quantized ONNX graph made float again, with the `onnx` package and numpy only.

onnxruntime's dynamic quantization stores int8/uint8 weights with a scale and zero point and
quantizes each activation at run time (`DynamicQuantizeLinear`) before an integer kernel
(`MatMulInteger`, `ConvInteger`, `DynamicQuantizeLSTM`); the integer result is cast and scaled
back. CUDA lacks kernels for several of these, so a GPU runs such a graph partly on the CPU. Here
each weight is dequantized once, `(q - zero_point) * scale`, and each integer op with its
activation quantizer and rescaling becomes the float op it replaced, writing the tensor its
rescaling wrote: every other node, and every named tensor a caller reads (a durations output),
stays as it was. The float result differs from the int8 one only by the activations' rounding.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import helper, numpy_helper

QUANTIZED_OPS = frozenset({
    "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeLSTM",
    "QuantizeLinear", "DequantizeLinear",
})
Array = npt.NDArray[Any]


class UnknownPattern(ValueError):
    """The graph quantizes in a way this pass does not know (another exporter or version)."""


class _Graph:
    """Indexes over one graph: who writes a tensor, who reads it, the initializers."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                self.consumers[name].append(node)
        self.outputs = {o.name for o in graph.output}
        self.dropped: set[int] = set()
        self.added: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []
        """(new node, node it takes the place of) pairs, inserted where the old one was."""
        self._names: set[str] = set(self.initializers) | set(self.producer)
        self._weights: dict[tuple[str, ...], str] = {}

    def array(self, name: str) -> Array:
        if name not in self.initializers:
            raise UnknownPattern(f"{name!r} is not a constant weight")
        return numpy_helper.to_array(self.initializers[name])

    def fresh(self, base: str) -> str:
        name, n = base, 0
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._names.add(name)
        return name

    def constant(self, base: str, value: Array) -> str:
        name = self.fresh(base)
        self.graph.initializer.append(numpy_helper.from_array(value, name))
        return name

    def weight(self, key: tuple[str, ...], base: str, make: Callable[[], Array]) -> str:
        """The float weight made by `make` from the initializers named in `key`, made once: a
        weight shared by several nodes (ALBERT's layers share theirs) stays one tensor."""
        if key not in self._weights:
            self._weights[key] = self.constant(base, make())
        return self._weights[key]

    def only_consumer(self, name: str, op_type: str) -> onnx.NodeProto:
        readers = self.consumers.get(name, [])
        if len(readers) != 1 or readers[0].op_type != op_type or name in self.outputs:
            found = ", ".join(n.op_type for n in readers) or "nothing"
            raise UnknownPattern(f"{name!r} feeds {found}, not one {op_type}")
        return readers[0]

    def made_by(self, name: str, op_type: str) -> onnx.NodeProto:
        node = self.producer.get(name)
        if node is None or node.op_type != op_type:
            raise UnknownPattern(f"{name!r} does not come from a {op_type}")
        return node

    def replace(self, new: onnx.NodeProto, *old: onnx.NodeProto) -> None:
        """`new` takes the place of `old[-1]` (the node writing its output); all `old` go."""
        self.added.append((new, old[-1]))
        self.dropped.update(id(n) for n in old)

    def rebuild(self) -> None:
        """The graph with the replacements, then without nodes and initializers nobody reads."""
        instead = {id(old): new for new, old in self.added}
        nodes: list[onnx.NodeProto] = []
        for node in self.graph.node:
            if id(node) in instead:
                nodes.append(instead[id(node)])
            elif id(node) not in self.dropped:
                nodes.append(node)
        nodes = _live(nodes, self.outputs)
        read = {name for node in nodes for name in node.input} | self.outputs
        kept = [t for t in self.graph.initializer if t.name in read]
        del self.graph.node[:]
        self.graph.node.extend(nodes)
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept)
        # Types recorded for the integer tensors are gone or wrong now; onnxruntime infers them.
        del self.graph.value_info[:]


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    """`nodes` (in order) less those whose outputs nothing reads, repeated until none is left."""
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        kept = [n for n in nodes if any(o and o in read for o in n.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


def _dequantized(q: Array, scale: Array, zero: Array | None, axis: int) -> npt.NDArray[np.float32]:
    """`(q - zero) * scale` in float32; a scale or zero point of more than one value runs along
    `axis` (one per output channel)."""

    def along(values: Array) -> npt.NDArray[np.float32]:
        shape = [1] * q.ndim
        if values.size > 1:
            shape[axis] = values.size
        return values.astype(np.float32).reshape(shape)

    result = q.astype(np.float32)
    if zero is not None:
        result -= along(zero)
    return result * along(scale)


def _activation(g: _Graph, quantized: str) -> tuple[str, onnx.NodeProto]:
    """The float tensor behind an input quantized at run time, and its quantizer."""
    quantizer = g.made_by(quantized, "DynamicQuantizeLinear")
    if quantizer.output[0] != quantized:
        raise UnknownPattern(f"{quantized!r} is not the quantized output of its quantizer")
    return quantizer.input[0], quantizer


def _weight_scale(g: _Graph, scales: str, quantizer: onnx.NodeProto) -> str:
    """The weight's scale (its initializer) from `activation scale * weight scale`, the product
    the integer result is multiplied by."""
    product = g.made_by(scales, "Mul")
    others = [name for name in product.input if name != quantizer.output[1]]
    if len(others) != 1:
        raise UnknownPattern(f"{scales!r} is not the activation scale times a weight scale")
    g.array(others[0])  # a constant, or this is no weight scale
    return str(others[0])


def _rescale(g: _Graph, integer: str, quantizer: onnx.NodeProto
             ) -> tuple[onnx.NodeProto, onnx.NodeProto, str]:
    """The `Cast` to float and the `Mul` by both scales after an integer result."""
    cast = g.only_consumer(integer, "Cast")
    if helper.get_attribute_value(cast.attribute[0]) != onnx.TensorProto.FLOAT:
        raise UnknownPattern(f"{integer!r} is cast to something other than float")
    scale = g.only_consumer(cast.output[0], "Mul")
    scales = next(name for name in scale.input if name != cast.output[0])
    return cast, scale, _weight_scale(g, scales, quantizer)


def _float_weight(g: _Graph, node: onnx.NodeProto, scale: str, axis: int) -> str:
    """The float weight of an integer MatMul or Conv: input 1 with its zero point (input 3)."""
    weight = node.input[1]
    zero = node.input[3] if len(node.input) > 3 else ""

    def make() -> Array:
        return _dequantized(g.array(weight), g.array(scale),
                            g.array(zero) if zero else None, axis)

    return g.weight((weight, scale, zero), weight.removesuffix("_quantized"), make)


def _float_matmul(g: _Graph, node: onnx.NodeProto) -> None:
    x, quantizer = _activation(g, node.input[0])
    cast, scale, weight_scale = _rescale(g, node.output[0], quantizer)
    w = _float_weight(g, node, weight_scale, axis=-1)
    g.replace(helper.make_node("MatMul", [x, w], [scale.output[0]],
                               name=node.name.removesuffix("_quant")), node, cast, scale)


def _quantized_bias(g: _Graph, name: str) -> Array:
    """The float bias behind `Reshape(Cast(Floor|Round(Div(bias, scales))))`, the int32 bias the
    quantizer computes at run time from the activation's scale."""
    node = g.made_by(name, "Reshape")
    node = g.made_by(node.input[0], "Cast")
    rounding = g.producer.get(node.input[0])
    if rounding is None or rounding.op_type not in ("Floor", "Round"):
        raise UnknownPattern(f"the quantized bias {name!r} is not rounded from a division")
    division = g.made_by(rounding.input[0], "Div")
    return g.array(division.input[0]).astype(np.float32).reshape(-1)


def _float_conv(g: _Graph, node: onnx.NodeProto) -> None:
    x, quantizer = _activation(g, node.input[0])
    readers = g.consumers.get(node.output[0], [])
    dropped = [node]
    bias: Array | None = None
    integer = node.output[0]
    if len(readers) == 1 and readers[0].op_type == "Add":  # the int32 bias, added before the cast
        add = readers[0]
        bias = _quantized_bias(g, next(i for i in add.input if i != integer))
        integer = add.output[0]
        dropped.append(add)
    cast, scale, weight_scale = _rescale(g, integer, quantizer)
    inputs = [x, _float_weight(g, node, weight_scale, axis=0)]
    if bias is not None:
        inputs.append(g.constant(node.name.removesuffix("_quant") + ".bias", bias))
    conv = helper.make_node("Conv", inputs, [scale.output[0]],
                            name=node.name.removesuffix("_quant"))
    conv.attribute.extend(node.attribute)  # same attributes as Conv (pads, strides, group...)
    g.replace(conv, *dropped, cast, scale)


def _lstm_weight(g: _Graph, names: tuple[str, str, str], base: str) -> str:
    """ONNX LSTM's [directions, 4*hidden, input] weight from the quantized op's transposed
    [directions, input, 4*hidden] one, scaled per direction or per direction and column."""

    def make() -> Array:
        q, scale, zero = (g.array(name) for name in names)
        directions = q.shape[0]
        shape = (directions, 1, -1) if scale.size > directions else (directions, 1, 1)
        values = (q.astype(np.float32) - zero.astype(np.float32).reshape(shape)) \
            * scale.astype(np.float32).reshape(shape)
        return np.ascontiguousarray(values.transpose(0, 2, 1))

    return g.weight(names, base, make)


def _float_lstm(g: _Graph, node: onnx.NodeProto) -> None:
    inputs = list(node.input) + [""] * (12 - len(node.input))
    base = node.name.removesuffix("_quant")
    w = _lstm_weight(g, (inputs[1], inputs[8], inputs[9]), base + ".W")
    r = _lstm_weight(g, (inputs[2], inputs[10], inputs[11]), base + ".R")
    float_inputs = [inputs[0], w, r, *inputs[3:8]]
    while float_inputs and not float_inputs[-1]:
        float_inputs.pop()
    lstm = helper.make_node("LSTM", float_inputs, list(node.output), name=base)
    lstm.attribute.extend(node.attribute)
    g.replace(lstm, node)


def _float_dequantize(g: _Graph, node: onnx.NodeProto) -> None:
    """A DequantizeLinear of a weight (directly or of rows picked by Gather) becomes the float
    weight; one of a QuantizeLinear at run time (a fake-quantized activation) becomes the
    activation itself."""
    source = node.input[0]
    zero_name = node.input[2] if len(node.input) > 2 else ""
    axis = next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "axis"),
                1)

    def float_weight(name: str) -> str:
        def make() -> Array:
            return _dequantized(g.array(name), g.array(node.input[1]),
                                g.array(zero_name) if zero_name else None, axis)

        return g.weight((name, node.input[1], zero_name, str(axis)),
                        name.removesuffix("_quantized") + ".float", make)

    if source in g.initializers:
        g.replace(helper.make_node("Identity", [float_weight(source)], list(node.output),
                                   name=node.name), node)
        return
    writer = g.producer.get(source)
    if writer is not None and writer.op_type == "Gather" and writer.input[0] in g.initializers:
        if g.array(node.input[1]).size > 1:
            raise UnknownPattern(f"{node.name!r} dequantizes gathered rows per channel")
        table = float_weight(writer.input[0])
        gather = helper.make_node("Gather", [table, writer.input[1]], list(node.output),
                                  name=writer.name)
        gather.attribute.extend(writer.attribute)
        g.replace(gather, writer, node)
        return
    if writer is not None and writer.op_type == "QuantizeLinear":
        g.replace(helper.make_node("Identity", [writer.input[0]], list(node.output),
                                   name=node.name), writer, node)
        return
    raise UnknownPattern(f"{node.name!r} dequantizes {source!r}, which is no weight")


_REWRITES = {
    "MatMulInteger": _float_matmul,
    "ConvInteger": _float_conv,
    "DynamicQuantizeLSTM": _float_lstm,
    "DequantizeLinear": _float_dequantize,
}


def dequantize(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (changed in place and returned) with float weights and float ops only.

    Raises UnknownPattern when a quantized op is left that this pass cannot rewrite: better no
    float graph than a wrong one."""
    g = _Graph(model.graph)
    for node in list(model.graph.node):
        rewrite = _REWRITES.get(node.op_type)
        if rewrite is not None:
            rewrite(g, node)
    g.rebuild()
    left = sorted({n.op_type for n in model.graph.node if n.op_type in QUANTIZED_OPS})
    if left:
        raise UnknownPattern(f"quantized ops left after the rewrite: {', '.join(left)}")
    return model
