"""INT8 Q/DQ variant of `emotion_encoder`, gated by the emotion labels it leads to.

    python -m export.emotion.int8      # build (cached with the artifact) and print the gate

Quantisation (`export.quantize`): every linear layer (MatMul with a constant weight) but the
MLP's down projection (`/output/dense`, which reads GELU outputs with long tails, as Whisper's
fc2), per-channel INT8 weights, UINT8 activations calibrated by MinMax on the 280 training
sentences of `emotion_sentences.json` (one feed each, recorded as calibration.json beside the
artifact). With the down projection quantised too it was 1.9x faster than FP32 but failed the
intensity bound by a hair (mean |diff| 0.0502). UINT8 activations, not TensorRT's
symmetric INT8: this model runs in ONNX Runtime on the CPU in both runtimes, and ONNX
Runtime's signed-activation kernels ran slower than FP32 here (14.8 vs 5.4 ms a sentence).

Gate: `evals.emotion.int8_gate`, the labels and intensities of the 105 held-out sentences
and both graphs' speed; the config serves the variant on the CPU where it is faster.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from avatar.animation.emotion_classifier import SentenceTokenizer
from export.common import onnx_session
from export.gates import CALIBRATION_FILE, judged_variant, variant_gate
from export.quantize import VARIANT_FILE, built_record, linear_nodes, quantize_qdq

log = logging.getLogger(__name__)

SCHEME = "minmax-linear-no-ffn-out-u8s8"
SKIP = ("/output/dense",)  # the MLP down projections stay FP32


def gate(fp32_path: Path, int8_path: Path) -> dict:
    """The gate's figures and verdict, and the speed of both graphs, as a sidecar record."""
    from evals.emotion import int8_gate

    paths = {"fp32": fp32_path, "int8": int8_path}
    record = int8_gate({name: onnx_session(path) for name, path in paths.items()})
    return {**record, "scheme": SCHEME, "calibration": CALIBRATION_FILE}


gate_folder = variant_gate(gate)  # the gate of the variant in an artifact folder


def build_variant(out_dir: Path) -> dict:
    """model.onnx in `out_dir` -> model.int8.onnx + calibration.json; returns its verdict's
    record (export.gates: recorded, or measured by `gate`)."""
    from evals.sentences import load_sentences

    out_dir = Path(out_dir)
    sentences = list(load_sentences()["train"][0])
    tokenize = SentenceTokenizer()
    source = out_dir / "model.onnx"
    feeds = [tokenize([text]) for text in sentences]
    quantize_qdq(
        source,
        out_dir / VARIANT_FILE,
        feeds,
        ops=["MatMul"],
        nodes=[n for n in linear_nodes(source) if not any(k in n for k in SKIP)],
        symmetric=False,
    )
    calibration = {"scheme": SCHEME, "method": "MinMax", "sentences": sentences}
    return judged_variant("emotion_encoder", out_dir, feeds[0], gate, calibration)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder, record = built_record("emotion_encoder")
    log.info("%s", json.dumps(record, indent=1))
    again = gate_folder(folder)["speed_1_thread"]
    log.info("speed measured again now (1 thread): %s", json.dumps(again))


if __name__ == "__main__":
    main()
