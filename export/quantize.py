"""Static INT8 quantisation in Q/DQ form, shared by every model's INT8 variant.

ONNX Runtime's `quantize_static` with a recorded list of real input feeds and per-channel
weights, built so that the same inputs give the same file and the same numerics on any x86
CPU (a variant built and gated on one machine once failed its gate on another):

- 7-bit weights (`reduce_range`, the default): x86 CPUs without VNNI multiply UINT8 x INT8
  pairs with `vpmaddubsw`, which saturates at 16 bits when both are large; CPUs with VNNI do
  not. With weights in [-64, 64] no pair sum can saturate. Measured on `lipsync` (UINT8
  activations) against the same graph run with SSE4.2 kernels (qemu -cpu Nehalem): 8-bit
  weights gave the same frame's viseme on 78 % of frames, 7-bit on 98 %; and the 8-bit
  variant that passed its gate on a VNNI machine failed it on this project's AVX2 machines
  (frame accuracy 0.7356 vs FP32 0.7763). `tts_vits` keeps 8-bit weights: with 7 bits it
  failed its gate (WER +3.2 points), and its INT8 x INT8 products are not the saturating
  UINT8 x INT8 form.
- calibration ranges snapped outward onto a grid of RANGE_STEPS_PER_OCTAVE steps per octave
  and recorded beside the variant (RANGES_FILE): the FP32 runs that calibrate differ in their
  last bits from CPU to CPU, and a snapped range does not (unless a value lies within that
  difference of a grid point).

Two activation forms:

- symmetric INT8 (zero point 0): what TensorRT's explicit quantisation takes; for models
  whose engines are built from the Q/DQ graph (ASR, TTS);
- asymmetric UINT8 activations with INT8 weights: ONNX Runtime's fast form on x86 CPUs
  (its signed-activation kernels ran 2-3x slower here); for models served by ONNX Runtime
  on the CPU in production too (`emotion_encoder`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

VARIANT_FILE = "model.int8.onnx"  # beside model.onnx; its gate in validation.variants


class FeedReader:
    """onnxruntime CalibrationDataReader over recorded feeds."""

    def __init__(self, feeds: Iterable[dict[str, np.ndarray]]):
        self._items = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._items, None)


def linear_nodes(path: Path) -> list[str]:
    """MatMul/Gemm nodes one of whose inputs is an initializer: the model's linear layers.

    A weight that another kind of node also reads stays FP32: Whisper's decoder output
    projection shares its matrix with the token embedding's Gather, and a quantised shared
    initializer is dequantised whole (26M values) on every step, 5x slower than FP32."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    return [
        n.name
        for n in graph.node
        if n.op_type in ("MatMul", "Gemm")
        and any(i in weights and readers[i] <= {"MatMul", "Gemm"} for i in n.input)
    ]


RANGES_FILE = "calibration_ranges.json"  # beside the variant: the snapped ranges it was built from
RANGE_STEPS_PER_OCTAVE = 16  # a range grows by at most 1/16 (6 %) when snapped


def snap_outward(value: float, up: bool) -> float:
    """`value` moved away from the inside of its range (`up`: towards +inf) onto a grid of
    RANGE_STEPS_PER_OCTAVE steps per power of two; 0 stays 0. The grid's points are exact
    float32 numbers."""
    if value == 0.0 or not np.isfinite(value):
        return float(value)
    step = 2.0 ** (np.floor(np.log2(abs(value))) - np.log2(RANGE_STEPS_PER_OCTAVE))
    return float((np.ceil if up else np.floor)(value / step) * step)


def calibrated_ranges(
    source: Path,
    feeds: Iterable[dict[str, np.ndarray]],
    ops: Sequence[str],
    method: str,
    extra: dict,
):  # -> onnxruntime.quantization.calibrate.TensorsData
    """Each calibrated tensor's (lowest, highest) over `feeds`, snapped outward."""
    import tempfile

    from onnxruntime.quantization import CalibrationMethod, create_calibrator
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    options = {"percentile": extra["CalibPercentile"]} if "CalibPercentile" in extra else {}
    with tempfile.TemporaryDirectory(prefix="calibrate-") as tmp:
        calibrator = create_calibrator(
            Path(source),
            list(ops),
            augmented_model_path=str(Path(tmp) / "augmented.onnx"),
            calibrate_method=CalibrationMethod[method],
            extra_options=options,
        )
        calibrator.collect_data(FeedReader(feeds))
        ranges = calibrator.compute_data()
        del calibrator  # its session holds the augmented file open
    snapped = {}
    for name, data in ranges.items():
        lowest, highest = (float(np.asarray(v).reshape(-1)[0]) for v in data.range_value)
        snapped[name] = TensorData(
            lowest=np.float32(snap_outward(lowest, up=False)),
            highest=np.float32(snap_outward(highest, up=True)),
        )
    return TensorsData(ranges.calibration_method, snapped)


def quantize_qdq(
    source: Path,
    out: Path,
    feeds: Iterable[dict[str, np.ndarray]],
    *,
    ops: Sequence[str] = ("MatMul", "Gemm"),
    nodes: Sequence[str] | None = None,
    method: str = "MinMax",
    symmetric: bool = True,
    seven_bit_weights: bool = True,
    extra: dict | None = None,
) -> None:
    """`source` -> `out` with INT8 Q/DQ around `ops` (only `nodes`, when given), per-channel
    weights (7-bit unless told otherwise), activations calibrated on `feeds` by `method` (an
    onnxruntime CalibrationMethod name) with their ranges snapped and written to RANGES_FILE
    beside `out`; `symmetric`: INT8 activations with zero point 0 (TensorRT), else UINT8."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.calibrate import save_tensors_data

    extra = dict(extra or {})
    ranges_file = Path(out).with_name(RANGES_FILE)
    save_tensors_data(calibrated_ranges(source, feeds, ops, method, extra), ranges_file)
    ranges_file.chmod(0o644)  # written private by the quantizer's temporary file
    extra.pop("CalibPercentile", None)  # used by the calibration above
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # the quantizer logs advice on the root logger
    try:
        quantize_static(
            str(source),
            str(out),
            None,  # the ranges come from ranges_file
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(ops),
            nodes_to_quantize=list(nodes) if nodes is not None else None,
            per_channel=True,
            reduce_range=seven_bit_weights,
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod[method],
            calibration_cache_path=str(ranges_file),
            extra_options={
                **({"ActivationSymmetric": True, "WeightSymmetric": True} if symmetric else {}),
                **extra,
            },
        )
    finally:
        root.setLevel(level)


def logged(model: str, record: dict) -> dict:
    """`record` (a variant's gate record), after logging its verdict."""
    verdict = "passes its gate" if record["passes_gate"] else "fails its gate"
    log.info("%s %s: %s (%s)", model, VARIANT_FILE, verdict, record["why"])
    return record


def built_record(model: str) -> tuple[Path, dict]:
    """The artifact folder of `model` (built when not cached) and its variant's gate record."""
    from export.registry import ensure_all
    from export.sidecar import Sidecar

    folder = ensure_all([model])[model]
    return folder, Sidecar.load(folder).validation["variants"][VARIANT_FILE]
