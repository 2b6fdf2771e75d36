"""Kokoro in two graphs, so that segments of several requests share one vocoder run (float graphs).

Kokoro's graph reads one segment: its text encoder, duration predictor and alignment build one
item's frames. The decoder (the iSTFTNet vocoder, most of the work) needs no alignment, so the
float graph is cut where the encoder hands it the aligned features (`ASR`, `F0`, `ENERGY` and the
style): the encoder part runs per segment as before, the decoder part takes a padded batch with
each item's frame count (`frames`). Five things in the exported decoder assume one item, and
are rewritten for a batch:
- its AdaIN layers normalise over the whole time axis (54 instance norms, exported as two
  ReduceMean each): they become sums over each item's own frames;
- a convolution next to an item's end reads the padding where one run read zeros: every Conv and
  ConvTranspose input is multiplied by the item mask at its resolution;
- the harmonic source is reflect-padded for its STFT at the batch's end: each item is reflected
  at its own end (GatherElements);
- the sine generator's two linear Resizes run item by item on each item's own length (a Scan):
  onnxruntime's Resize rounds the rows of a batch differently from one item's (1 ulp), and the
  phase they carry is summed over the segment, so 1 ulp became 1e-2 in the audio;
- three nodes carry a batch of 1 in their shapes (the harmonic source's reshape, the iSTFT's
  window-sum division exported as an index_put, the audio's final reshape).
Which time resolution each masked tensor has (frames x 1, 2, 20, 120, 600, plus an offset) is
measured once on the built graph, not assumed.

Both graphs are built once from the float32 graph into the cache dir and checked like the float
graphs. float32 only (`batch_graphs` says why not float16); the int8 graph quantizes its
activations with one scale per tensor, which over a batch would mix the items.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.base import CancelToken, LoadFailed
from engines.batching import Batcher, Feeds
from engines.kokoro_float import _build_once, recipe
from engines.onnx import RuntimeOptions, open_session, run

if TYPE_CHECKING:
    import onnx

ASR = "/encoder/MatMul_1_output_0"
"""The text features repeated along the predicted durations: [1, 512, frames]."""
F0 = "/encoder/Reshape_output_0"
"""Predicted pitch, two values per frame: [1, 2 * frames]."""
ENERGY = "/encoder/Reshape_1_output_0"
"""Predicted energy (StyleTTS 2's N), two values per frame: [1, 2 * frames]."""
DURATIONS = "/encoder/Clip_output_0"
FRAMES = "frames"
"""The batched decoder's extra input: each item's frame count, [batch]."""
SINE_RESIZES = ("/decoder/decoder/generator/m_source/l_sin_gen/Resize",
                "/decoder/decoder/generator/m_source/l_sin_gen/Resize_1")
HARMONIC_PAD = "/decoder/decoder/generator/Pad"
GENERATOR = "/decoder/decoder/generator/"
ISTFT = "/decoder/decoder/generator/istft/stft/"
PROBE_FRAMES = (24, 31)


class UnknownGraph(ValueError):
    """The float graph is not the Kokoro v1.0 export these rewrites were written for."""


@functools.cache
def batch_recipe() -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    return f"{recipe()}-{digest.hexdigest()[:16]}"


def graph_files() -> tuple[str, str]:
    return "kokoro-v1.0.fp32.encoder.onnx", "kokoro-v1.0.fp32.decoder-batched.onnx"


def _part(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """The nodes of `model` that compute `outputs` from `inputs`, as a model of their own."""
    from onnx import TensorProto, helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    needed, seen, kept = list(outputs), set(inputs), set()
    while needed:
        name = needed.pop()
        if name in seen or not name:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None and id(node) not in kept:
            kept.add(id(node))
            needed.extend(node.input)
    nodes = [n for n in graph.node if id(n) in kept]
    read = {name for n in nodes for name in n.input}
    weights = [w for w in graph.initializer if w.name in read and w.name not in inputs]
    made = {out for n in nodes for out in n.output} | {w.name for w in weights} | set(inputs)
    missing = sorted(read - made - {""})
    if missing:
        raise UnknownGraph(f"the cut leaves {missing[0]} without a producer")
    given = {i.name: i for i in graph.input}
    ins = [given.get(name) or helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
           for name in inputs]
    returned = {o.name: o for o in graph.output}
    outs = [returned.get(name) or helper.make_empty_tensor_value_info(name) for name in outputs]
    part = helper.make_graph(nodes, "kokoro", ins, outs, weights)
    return helper.make_model(part, opset_imports=model.opset_import, ir_version=model.ir_version)


class _Editor:
    """Adds named constants and nodes to a graph."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.nodes: dict[str, onnx.NodeProto] = {n.name: n for n in graph.node}

    def const(self, name: str, value: Any, dtype: Any = np.int64) -> str:
        from onnx import numpy_helper

        name = f"kbatch/{name}"
        if not any(w.name == name for w in self.graph.initializer):
            self.graph.initializer.append(
                numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, name: str) -> onnx.NodeProto:
        try:
            return self.nodes[name]
        except KeyError:
            raise UnknownGraph(f"the decoder has no node {name}") from None


def _op(op: str, inputs: list[str], output: str, **attributes: Any) -> onnx.NodeProto:
    from onnx import helper

    return helper.make_node(op, inputs, [output], name=output, **attributes)


def _batch_shapes(model: onnx.ModelProto) -> None:
    """The decoder's nodes built for a batch of one, made to keep the batch."""
    from onnx import TensorProto, helper

    graph = model.graph
    edit = _Editor(graph)
    for given in graph.input:
        if given.name == "style":
            given.type.tensor_type.shape.dim[0].dim_param = "batch"
    # The harmonic source [batch, samples] was reshaped to [1, 1, samples] ...
    edit.node(GENERATOR + "Concat").input[0] = edit.const("minus_one", [-1])
    # ... and after its reflect pad to [shape[1], shape[2]]: [shape[0], shape[2]] keeps the batch.
    edit.node(GENERATOR + "Gather_2").input[1] = edit.const("zero", 0)
    # The iSTFT divides its first samples by the window's overlap sum, exported as an index_put
    # whose indices broadcast the batch against the sample indices (wrong for any batch but 1):
    # the same division as head / where(kept, window_sum, 1) ++ tail.
    scatter = edit.node(ISTFT + "ScatterND")
    signal, window = ISTFT + "Squeeze_1_output_0", ISTFT + "Slice_1_output_0"
    kept = ISTFT + "Greater_output_0"
    division = [
        _op("Shape", [window], "kbatch/istft/window_length"),
        _op("Slice", [signal, edit.const("start", [0]), "kbatch/istft/window_length",
                      edit.const("axis_one", [1])], "kbatch/istft/head"),
        _op("Slice", [signal, "kbatch/istft/window_length", edit.const("end", [2 ** 62]),
                      edit.const("axis_one", [1])], "kbatch/istft/tail"),
        _op("CastLike", [edit.const("one", 1.0, np.float32), window], "kbatch/istft/one"),
        _op("Where", [kept, window, "kbatch/istft/one"], "kbatch/istft/divisor"),
        _op("Div", ["kbatch/istft/head", "kbatch/istft/divisor"], "kbatch/istft/divided"),
        helper.make_node("Concat", ["kbatch/istft/divided", "kbatch/istft/tail"],
                         [scatter.output[0]], name="kbatch/istft/joined", axis=1),
    ]
    at = list(graph.node).index(scatter)
    graph.node.remove(scatter)
    for node in reversed(division):
        graph.node.insert(at, node)
    # The audio: [batch, samples], not row 0 of [1, samples].
    edit.node("/decoder/Reshape").input[1] = edit.const("keep_rows", [0, -1])
    graph.node.remove(edit.node("/Gather"))
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("/decoder/Reshape_output_0",
                                                      TensorProto.FLOAT, ["batch", "samples"]))
    _prune(graph)


def _prune(graph: onnx.GraphProto) -> None:
    producer = {out: node for node in graph.node for out in node.output}
    live: set[int] = set()
    needed = [o.name for o in graph.output]
    while needed:
        node = producer.get(needed.pop())
        if node is not None and id(node) not in live:
            live.add(id(node))
            needed.extend(name for name in node.input if name)
    nodes = [n for n in graph.node if id(n) in live]
    del graph.node[:]
    graph.node.extend(nodes)
    read = {name for n in nodes for name in n.input}
    weights = [w for w in graph.initializer if w.name in read]
    del graph.initializer[:]
    graph.initializer.extend(weights)


def _time_inputs(graph: onnx.GraphProto) -> list[str]:
    """The tensors whose time axis the rewrite masks or cuts per item."""
    names = [n.input[0] for n in graph.node
             if n.op_type in ("ReduceMean", "Conv", "ConvTranspose")
             or n.name in (HARMONIC_PAD, *SINE_RESIZES)]
    return list(dict.fromkeys(names))


def _resolutions(model: onnx.ModelProto, names: list[str]) -> dict[str, tuple[int, int]]:
    """(rate, offset) of each tensor: its time axis is rate * frames + offset long, measured by
    running the decoder on two frame counts."""
    from onnx import helper

    from engines.onnx import _ort

    probe = type(model)()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    session = _ort().InferenceSession(probe.SerializeToString(),
                                      providers=["CPUExecutionProvider"])
    lengths = []
    for frames in PROBE_FRAMES:
        outputs = session.run(names, {
            ASR: np.zeros((1, 512, frames), np.float32),
            F0: np.zeros((1, 2 * frames), np.float32),
            ENERGY: np.zeros((1, 2 * frames), np.float32),
            "style": np.zeros((1, 256), np.float32)})
        lengths.append([o.shape[-1] for o in outputs])
    low, high = PROBE_FRAMES
    found = {}
    for name, short, long in zip(names, *lengths, strict=True):
        rate, rest = divmod(long - short, high - low)
        if rest or rate <= 0:
            raise UnknownGraph(f"{name} has no time axis that grows with the frames")
        found[name] = (rate, short - rate * low)
    return found


def _masked(model: onnx.ModelProto) -> None:
    """Each item's statistics, convolutions, reflection and resampling on its own frames."""
    from onnx import TensorProto, helper

    graph = model.graph
    edit = _Editor(graph)
    resolution = _resolutions(model, _time_inputs(graph))
    graph.input.append(helper.make_tensor_value_info(FRAMES, TensorProto.INT64, ["batch"]))
    first = [_op("Shape", [ASR], "kbatch/asr_shape"),
             _op("Gather", ["kbatch/asr_shape", edit.const("two", 2)], "kbatch/max_frames",
                 axis=0),
             _op("Unsqueeze", [FRAMES, edit.const("batch_axes", [1, 2])], "kbatch/frames")]
    masks: dict[tuple[int, int], str] = {}

    def mask(name: str) -> str:
        """Prefix of [batch, 1, time] `mask`, [batch, 1, 1] `valid` and `count` for `name`'s
        resolution; the rows past an item's own length are 0."""
        rate, offset = resolution[name]
        if (rate, offset) not in masks:
            p = f"kbatch/mask_{rate}_{offset}/"
            r, c = edit.const(f"rate_{rate}", rate), edit.const(f"offset_{offset}", offset)
            first.extend([
                _op("Mul", ["kbatch/max_frames", r], p + "scaled"),
                _op("Add", [p + "scaled", c], p + "length"),
                _op("Range", [edit.const("zero", 0), p + "length", edit.const("step", 1)],
                    p + "positions"),
                _op("Mul", ["kbatch/frames", r], p + "item_scaled"),
                _op("Add", [p + "item_scaled", c], p + "valid"),
                _op("Less", [p + "positions", p + "valid"], p + "inside"),
                _op("Cast", [p + "inside"], p + "mask", to=TensorProto.FLOAT),
                _op("Cast", [p + "valid"], p + "count", to=TensorProto.FLOAT),
            ])
            masks[rate, offset] = p
        return masks[rate, offset]

    body: list[onnx.NodeProto] = []
    zeroed: dict[str, str] = {}
    for node in list(graph.node):
        if node.op_type == "ReduceMean":
            _check_time_axis(graph, node)
            p, x, q = mask(node.input[0]), node.input[0], node.name + "/kbatch"
            body += [_op("Mul", [x, p + "mask"], q + "_masked"),
                     _op("ReduceSum", [q + "_masked", node.input[1]], q + "_sum", keepdims=1),
                     helper.make_node("Div", [q + "_sum", p + "count"], [node.output[0]],
                                      name=q + "_mean")]
            continue
        if node.op_type in ("Conv", "ConvTranspose"):
            x = node.input[0]
            if x not in zeroed:
                zeroed[x] = f"kbatch/zeroed_{len(zeroed)}"
                body.append(_op("Mul", [x, mask(x) + "mask"], zeroed[x]))
            node.input[0] = zeroed[x]
        elif node.name == HARMONIC_PAD:
            body += _reflect_each(edit, node, mask(node.input[0]))
            continue
        elif node.name in SINE_RESIZES:
            body += _resize_each(edit, node, resolution[node.input[0]])
            continue
        body.append(node)
    del graph.node[:]
    graph.node.extend(first + body)


def _check_time_axis(graph: onnx.GraphProto, node: onnx.NodeProto) -> None:
    from onnx import numpy_helper

    axes = next((numpy_helper.to_array(w) for w in graph.initializer if w.name == node.input[1]),
                None)
    if axes is None or axes.tolist() not in ([2], [-1]) or \
            any(a.name == "keepdims" and a.i == 0 for a in node.attribute):
        raise UnknownGraph(f"{node.name} is not an instance norm over time")


def _reflect_each(edit: _Editor, pad: onnx.NodeProto, p: str) -> list[onnx.NodeProto]:
    """x[b, 0, reflect(j - 10)] for each item b at its own end (the pad was 10 each side)."""
    from onnx import helper, numpy_helper

    pads = next((numpy_helper.to_array(w) for w in edit.graph.initializer
                 if w.name == pad.input[1]), None)
    if pads is None or pads.tolist() != [0, 0, 10, 0, 0, 10]:
        raise UnknownGraph(f"{pad.name} is not the 10-sample reflect pad it was")
    q = "kbatch/reflect/"
    one = edit.const("step", 1)
    return [
        _op("Add", [p + "length", edit.const("twenty", 20)], q + "padded_length"),
        _op("Range", [edit.const("zero", 0), q + "padded_length", one], q + "target"),
        _op("Sub", [q + "target", edit.const("ten", 10)], q + "source"),
        _op("Abs", [q + "source"], q + "from_start"),
        _op("Sub", [p + "valid", one], q + "last"),
        _op("Mul", [q + "last", edit.const("two", 2)], q + "twice_last"),
        _op("Sub", [q + "twice_last", q + "from_start"], q + "from_end"),
        _op("Less", [q + "from_start", p + "valid"], q + "before_end"),
        _op("Where", [q + "before_end", q + "from_start", q + "from_end"], q + "reflected"),
        _op("Sub", [p + "length", one], q + "last_row"),
        _op("Clip", [q + "reflected", edit.const("zero", 0), q + "last_row"], q + "index"),
        helper.make_node("GatherElements", [pad.input[0], q + "index"], [pad.output[0]],
                         name=q + "gathered", axis=2),
    ]


def _resize_each(edit: _Editor, resize: onnx.NodeProto, resolution: tuple[int, int]
                 ) -> list[onnx.NodeProto]:
    """`resize` run by a Scan on each item's own length, zero-padded to the batch's. The body
    reads nothing from outside (the batch's length is its state), so the float16 conversion,
    which only sees the outer graph's readers, keeps what it needs."""
    from onnx import TensorProto, helper

    rate, offset = resolution
    q = resize.name + "/kbatch/"
    x, scales = resize.input[0], resize.input[2]
    two, three = edit.const("axis_two", [2]), edit.const("three", [3])
    attributes = {a.name: helper.get_attribute_value(a) for a in resize.attribute}

    def constant(name: str, value: Any, dtype: Any = np.int64) -> onnx.NodeProto:
        return helper.make_node("Constant", [], [name], name=name, value=helper.make_tensor(
            name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
            np.shape(value), np.asarray(value, dtype=dtype).reshape(-1).tolist()))

    item = [
        constant("c_rate", rate), constant("c_offset", offset), constant("c_zero", [0]),
        constant("c_one", [1]), constant("c_two", [2]), constant("c_no_pads", [0, 0]),
        _op("Identity", ["item_batch_length"], "item_batch_length_out"),
        _op("Mul", ["item_frames", "c_rate"], "item_scaled"),
        _op("Add", ["item_scaled", "c_offset"], "item_length"),
        _op("Unsqueeze", ["item_length", "c_zero"], "item_end"),
        _op("Slice", ["item_x", "c_zero", "item_end", "c_one"], "item_own"),
        _op("Unsqueeze", ["item_own", "c_zero"], "item_batch"),
        _op("Resize", ["item_batch", "", "item_scales"], "item_resized", **attributes),
        _op("Squeeze", ["item_resized", "c_zero"], "item_rows"),
        _op("Shape", ["item_rows"], "item_shape"),
        _op("Slice", ["item_shape", "c_one", "c_two"], "item_resized_length"),
        _op("Sub", ["item_batch_length", "item_resized_length"], "item_missing"),
        _op("Concat", ["c_no_pads", "c_zero", "item_missing"], "item_pads", axis=0),
        _op("Pad", ["item_rows", "item_pads"], "item_out"),
    ]
    body = helper.make_graph(
        item, "item",
        [helper.make_tensor_value_info("item_batch_length", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("item_scales", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("item_x", TensorProto.FLOAT, [q + "rows", q + "time"]),
         helper.make_tensor_value_info("item_frames", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("item_batch_length_out", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("item_scales_out", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("item_out", TensorProto.FLOAT,
                                       [q + "rows_out", q + "time_out"])])
    body.node.append(_op("Identity", ["item_scales"], "item_scales_out"))
    # The batch's resized length, as the Resize gives it: floor(length * scale).
    return [
        _op("Shape", [x], q + "shape"),
        _op("Slice", [q + "shape", two, three], q + "input_length"),
        _op("Cast", [q + "input_length"], q + "input_length_float", to=TensorProto.FLOAT),
        _op("Slice", [scales, two, three], q + "scale"),
        _op("Mul", [q + "input_length_float", q + "scale"], q + "length_float"),
        _op("Floor", [q + "length_float"], q + "length_floor"),
        _op("Cast", [q + "length_floor"], q + "length", to=TensorProto.INT64),
        helper.make_node("Scan", [q + "length", scales, x, FRAMES],
                         [q + "length_out", q + "scales_out", resize.output[0]],
                         name=q + "items", body=body, num_scan_inputs=2),
    ]


def encoder(model: onnx.ModelProto) -> onnx.ModelProto:
    """Tokens, style and speed -> the aligned features and the durations (one segment)."""
    return _part(model, ["tokens", "style", "speed"], [ASR, F0, ENERGY, DURATIONS])


def batched_decoder(model: onnx.ModelProto) -> onnx.ModelProto:
    """The aligned features of a padded batch and each item's frames -> [batch, samples]."""
    decoder = _part(model, [ASR, F0, ENERGY, "style"], ["audio"])
    _batch_shapes(decoder)
    _masked(decoder)
    return decoder


def batch_graphs(fp32: Path, stamp: str) -> tuple[Path, Path]:
    """The encoder and the batched decoder, built once beside the float32 graph `fp32`
    (identified by `stamp`). float32 only: the same two parts converted to float16 (with the
    fp16 graph's nodes kept float32) ran, but spoke 0.03-0.07 away from the one-graph fp16 run
    even for a batch of one, so the cut itself, not the batching, moved them."""
    import onnx

    first, second = (fp32.with_name(name) for name in graph_files())
    key = f"{stamp} {batch_recipe()}"
    try:
        _build_once(first, f"{key} encoder", lambda: encoder(onnx.load(str(fp32))))
        _build_once(second, f"{key} decoder", lambda: batched_decoder(onnx.load(str(fp32))))
    except UnknownGraph as exc:
        raise LoadFailed(f"Kokoro's batched graphs cannot be built: {exc}") from exc
    return first, second


@dataclass
class BatchedKokoro:
    """Runs a segment's encoder alone and its decoder in a padded run with other segments."""

    encoder: Any
    decoder: Any
    batcher: Batcher

    @classmethod
    def open(cls, fp32: Path, stamp: str, runtime: RuntimeOptions) -> BatchedKokoro:
        first, second = batch_graphs(fp32, stamp)
        batcher = Batcher(runtime.batch_size, runtime.batch_wait, _any_segment, padded, parts)
        return cls(open_session(first, runtime), open_session(second, runtime), batcher)

    def sessions(self) -> tuple[Any, Any]:
        return self.encoder, self.decoder

    def run(self, feeds: Feeds, cancel: CancelToken) -> tuple[np.ndarray, np.ndarray]:
        """(audio samples, durations) of one segment, as the one-graph run gives them."""
        asr, f0, energy, durations = run(self.encoder, feeds, cancel)
        (audio,) = self.batcher.run(self.decoder, {
            ASR: asr, F0: f0, ENERGY: energy, "style": feeds["style"],
            FRAMES: np.array([asr.shape[-1]], dtype=np.int64)}, cancel)
        return np.asarray(audio).reshape(-1), np.asarray(durations)


def _any_segment(feeds: Feeds) -> tuple[()]:
    """Every segment can share a run: style and frames are per item, speed is in the encoder."""
    return ()


def padded(items: list[Feeds]) -> Feeds:
    """The items' aligned features zero-padded to the longest; `frames` says each one's."""
    frames = np.concatenate([f[FRAMES] for f in items])
    longest = int(frames.max())

    def pad(name: str, rate: int) -> np.ndarray:
        rows = [f[name] for f in items]
        widths = [[(0, 0)] * (r.ndim - 1) + [(0, rate * longest - r.shape[-1])] for r in rows]
        return np.concatenate([np.pad(r, w) for r, w in zip(rows, widths, strict=True)])

    return {ASR: pad(ASR, 1), F0: pad(F0, 2), ENERGY: pad(ENERGY, 2),
            "style": np.concatenate([f["style"] for f in items]), FRAMES: frames}


def parts(items: list[Feeds], outputs: list[Any]) -> list[list[Any]]:
    """Each item's audio, [1, its frames x the hop], the padding cut off."""
    audio = np.asarray(outputs[0])
    frames = [int(f[FRAMES][0]) for f in items]
    hop, rest = divmod(audio.shape[-1], max(frames))
    if rest:
        raise ValueError(f"{audio.shape[-1]} samples are not whole frames of {max(frames)}")
    return [[audio[k:k + 1, :n * hop]] for k, n in enumerate(frames)]
