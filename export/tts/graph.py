"""Graph surgery on a Piper VITS ONNX graph (opset 15, as exported by piper_train).

The packaged graph takes `input [B, P] int64`, `input_lengths [B] int64`, `scales [3]`
and returns `output [B, 1, 1, S]`. `rewrite()` turns it into a graph for a Triton model
with dynamic batching and reproducible audio:

    phoneme_ids      int64   [batch, phonemes]     ^ _ p0 _ p1 ... $, padded with 0
    phoneme_lengths  int64   [batch, 1]            valid ids per item
    scales           float32 [batch, 3]            noise_scale, length_scale, noise_w per item
    noise_phonemes   float32 [batch, 2, n]         N(0, 1) for the duration predictor's flow
    noise_frames     float32 [batch, 192, m]       N(0, 1) for the prior over frames
 -> audio            float32 [batch, samples]      zeros after audio_lengths
    audio_lengths    int64   [batch, 1]            256 * sum(durations)
    durations        int64   [batch, phonemes]     frames (of 256 samples) per id; 0 for padding

The two RandomNormalLike ops become the noise inputs. Their lengths are free (n, m >= 1):
the graph repeats each noise cyclically along its last axis up to the length it needs and
slices it there, so a client fixes the noise for a seed before knowing the frame count,
and the noise an item sees does not depend on the other items of its batch.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

log = logging.getLogger(__name__)

HIDDEN_CHANNELS = 192  # the prior's channels (inter_channels of the VITS config)
HOP_LENGTH = 256
# Ops TensorRT's ONNX parser does not take, or takes only in some versions.
TENSORRT_UNSUPPORTED = {"RandomNormalLike", "RandomNormal", "RandomUniformLike", "Loop", "If"}
TENSORRT_DATA_DEPENDENT = {"NonZero"}  # supported from TensorRT 8.5 (data-dependent shape)


def _consumers(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [n for n in graph.node if name in n.input]


def _only(nodes: list[onnx.NodeProto], what: str) -> onnx.NodeProto:
    if len(nodes) != 1:
        raise ValueError(f"expected exactly one {what}, found {len(nodes)}: is this a Piper VITS?")
    return nodes[0]


class _Builder:
    """Appends nodes and constants with unique names."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.count = 0

    def const(self, value: np.ndarray, name: str) -> str:
        full = f"/surgery/{name}_{self.count}"
        self.count += 1
        self.graph.initializer.append(numpy_helper.from_array(np.asarray(value), full))
        return full

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        out = f"/surgery/{name}_{self.count}_output"
        self.count += 1
        self.graph.node.append(helper.make_node(op, inputs, [out], name=out[:-7], **attrs))
        return out

    def fit_noise(self, noise: str, like: str, name: str) -> str:
        """noise [B, C, n] repeated along axis 2 and sliced to the length of `like` [B, C, L]."""
        i64 = np.int64
        length = self.node(
            "Gather",
            [self.node("Shape", [like], f"{name}_shape"), self.const(np.array([2], i64), "axis2")],
            f"{name}_len",
        )
        have = self.node(
            "Gather",
            [
                self.node("Shape", [noise], f"{name}_nshape"),
                self.const(np.array([2], i64), "axis2"),
            ],
            f"{name}_nlen",
        )
        one = self.const(np.array([1], i64), "one")
        reps = self.node(
            "Div",
            [
                self.node("Sub", [self.node("Add", [length, have], f"{name}_a"), one], f"{name}_s"),
                have,
            ],
            f"{name}_reps",
        )
        repeats = self.node("Concat", [one, one, reps], f"{name}_repeats", axis=0)
        tiled = self.node("Tile", [noise, repeats], f"{name}_tile")
        zero = self.const(np.array([0], i64), "zero")
        return self.node(
            "Slice", [tiled, zero, length, self.const(np.array([2], i64), "ax")], f"{name}_fit"
        )


def _replace_input(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new


def _prune(graph: onnx.GraphProto) -> None:
    """Drop nodes and initializers that no output depends on; sort the rest topologically."""
    producer = {o: n for n in graph.node for o in n.output}
    needed: set[str] = set()
    order: list[onnx.NodeProto] = []
    placed: set[int] = set()
    stack = [(o.name, False) for o in graph.output]
    while stack:  # iterative post-order DFS: producers before consumers
        name, ready = stack.pop()
        node = producer.get(name)
        needed.add(name)
        if node is None or id(node) in placed:
            continue
        if ready:
            placed.add(id(node))
            order.append(node)
            continue
        stack.append((name, True))
        stack.extend((i, False) for i in node.input if i and id(producer.get(i)) not in placed)
    del graph.node[:]
    graph.node.extend(order)
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def _tensor(name: str, elem: int, dims: list[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def rewrite(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return the rewritten graph (see the module docstring); `model` is not modified."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    b = _Builder(graph)
    i64 = np.int64

    # -- per-item scales: Gather(scales[3], k) -> scales[:, k] as [B, 1, 1]
    for gather in _consumers(graph, "scales"):
        index = int(
            numpy_helper.to_array(next(i for i in graph.initializer if i.name == gather.input[1]))
        )
        column = b.node(
            "Gather", ["scales", b.const(np.array([index], i64), "k")], f"scale{index}", axis=1
        )
        per_item = b.node(
            "Unsqueeze", [column, b.const(np.array([2], i64), "ax")], f"scale{index}_b11"
        )
        _replace_input(graph, gather.output[0], per_item)

    # -- noise inputs instead of RandomNormalLike
    randoms = [n for n in graph.node if n.op_type == "RandomNormalLike"]
    dp_noise = _only([n for n in randoms if n.name.startswith("/dp/")], "duration-predictor noise")
    prior_noise = _only([n for n in randoms if not n.name.startswith("/dp/")], "prior noise")
    _replace_input(
        graph,
        dp_noise.output[0],
        b.fit_noise("noise_phonemes", dp_noise.input[0], "noise_phonemes"),
    )
    _replace_input(
        graph,
        prior_noise.output[0],
        b.fit_noise("noise_frames", prior_noise.input[0], "noise_frames"),
    )

    # -- outputs: audio [B, S], audio_lengths [B], durations [B, P]
    ceil = _only([n for n in graph.node if n.op_type == "Ceil"], "Ceil (duration predictor)")
    tanh = _only([n for n in graph.node if n.name == "/dec/Tanh"], "decoder Tanh")
    axis1 = b.const(np.array([1], i64), "axis1")
    durations = b.node(
        "Cast",
        [b.node("Squeeze", [ceil.output[0], axis1], "dur_sq")],
        "durations",
        to=TensorProto.INT64,
    )
    frames = b.node(
        "ReduceSum", [ceil.output[0], b.const(np.array([1, 2], i64), "ax12")], "frames", keepdims=0
    )
    samples = b.node(
        "Mul",
        [
            b.node("Clip", [frames, b.const(np.array(1.0, np.float32), "lo")], "frames_min1"),
            b.const(np.array(float(HOP_LENGTH), np.float32), "hop"),
        ],
        "samples",
    )
    audio_lengths = b.node("Cast", [samples], "audio_lengths", to=TensorProto.INT64)
    raw = b.node("Squeeze", [tanh.output[0], axis1], "audio_raw")  # [B, S]
    positions = b.node(
        "Range",
        [
            b.const(np.array(0, i64), "r0"),
            b.node(
                "Gather", [b.node("Shape", [raw], "audio_shape"), axis1], "audio_len_max", axis=0
            ),
            b.const(np.array(1, i64), "r1"),
        ],
        "positions",
    )
    valid = b.node(
        "Less",
        [
            b.node("Unsqueeze", [positions, b.const(np.array([0], i64), "ax0")], "pos_b"),
            b.node("Unsqueeze", [audio_lengths, axis1], "len_b"),
        ],
        "valid",
    )
    audio = b.node("Mul", [raw, b.node("Cast", [valid], "valid_f", to=TensorProto.FLOAT)], "audio")
    audio_lengths_b1 = b.node("Unsqueeze", [audio_lengths, axis1], "audio_lengths_b1")
    for name, src in (
        ("audio", audio),
        ("audio_lengths", audio_lengths_b1),
        ("durations", durations),
    ):
        graph.node.append(helper.make_node("Identity", [src], [name], name=f"/surgery/{name}"))

    # -- interface: renamed inputs, new outputs
    _replace_input(graph, "input", "phoneme_ids")
    lengths = b.node("Squeeze", ["phoneme_lengths", axis1], "phoneme_lengths_b")
    _replace_input(graph, "input_lengths", lengths)
    del graph.input[:]
    graph.input.extend(
        [
            _tensor("phoneme_ids", TensorProto.INT64, ["batch", "phonemes"]),
            _tensor("phoneme_lengths", TensorProto.INT64, ["batch", 1]),
            _tensor("scales", TensorProto.FLOAT, ["batch", 3]),
            _tensor("noise_phonemes", TensorProto.FLOAT, ["batch", 2, "noise_phonemes_len"]),
            _tensor(
                "noise_frames", TensorProto.FLOAT, ["batch", HIDDEN_CHANNELS, "noise_frames_len"]
            ),
        ]
    )
    del graph.output[:]
    graph.output.extend(
        [
            _tensor("audio", TensorProto.FLOAT, ["batch", "samples"]),
            _tensor("audio_lengths", TensorProto.INT64, ["batch", 1]),
            _tensor("durations", TensorProto.INT64, ["batch", "phonemes"]),
        ]
    )
    del graph.value_info[:]
    _prune(graph)
    onnx.checker.check_model(model)
    return model


def op_report(model: onnx.ModelProto) -> dict[str, int]:
    """Ops of `model` that TensorRT lacks or handles specially, with their counts."""
    counts = Counter(n.op_type for n in model.graph.node)
    watch = TENSORRT_UNSUPPORTED | TENSORRT_DATA_DEPENDENT
    return {op: counts[op] for op in sorted(watch) if counts[op]}
