"""INT8 Q/DQ variant of `lipsync`, gated by the visemes the face shows.

    python -m export.lipsync.int8      # build (cached with the artifact) and print the gate

Quantisation (`export.quantize`): the network's convolutions (per-channel INT8 weights, UINT8
activations calibrated by MinMax), not the feature front end: the STFT convolution and the mel
matrix read raw audio and spectral power, whose range spans many orders of magnitude, and a
log follows them. Calibration: the first CALIBRATION_SENTENCES training sentences spoken by the
packaged voice at its default scales (training/lipsync/data.py, cached, fixed seeds), recorded in
calibration.json. UINT8 activations as for `emotion_encoder`: the variant serves the embedded
(CPU) runtime; production runs FP32 under ONNX Runtime's TensorRT accelerator, which takes
symmetric INT8 only.

Gate: `evals.lipsync_gate.int8_gate`, the visemes of the 105 held-out sentences (frame
accuracy clean and in noise, p/b/m closures) and both graphs' speed.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from export.common import onnx_session
from export.gates import CALIBRATION_FILE, judged_variant, variant_gate
from export.quantize import VARIANT_FILE, built_record, quantize_qdq

log = logging.getLogger(__name__)

SCHEME = "minmax-conv-no-frontend-u8s8"
FRONT_END = ("/features/",)  # STFT Conv and mel MatMul stay FP32
CALIBRATION_SENTENCES = 12


def calibration_utterances() -> list:
    from evals.sentences import sentences
    from export.tts.utterances import load_or_synthesize

    return load_or_synthesize(sentences("train")[:CALIBRATION_SENTENCES], 1, varied=False)


def gate(fp32_path: Path, int8_path: Path) -> dict:
    """The gate's figures and verdict, and the speed of both graphs, as a sidecar record."""
    from evals.lipsync_gate import int8_gate
    from evals.sentences import sentences
    from export.tts.utterances import load_or_synthesize

    utts = load_or_synthesize(sentences("heldout"), 1, varied=False)
    paths = {"fp32": fp32_path, "int8": int8_path}
    record = int8_gate({name: onnx_session(path, threads=1) for name, path in paths.items()}, utts)
    return {**record, "scheme": SCHEME, "calibration": CALIBRATION_FILE}


gate_folder = variant_gate(gate)  # the gate of the variant in an artifact folder


def build_variant(out_dir: Path) -> dict:
    """model.onnx in `out_dir` -> model.int8.onnx + calibration.json; returns its verdict's
    record (export.gates: recorded, or measured by `gate`)."""
    import onnx

    out_dir = Path(out_dir)
    source = out_dir / "model.onnx"
    utts = calibration_utterances()
    graph = onnx.load(str(source), load_external_data=False).graph
    convs = [n.name for n in graph.node if n.op_type == "Conv" and not n.name.startswith(FRONT_END)]
    feeds = [{"audio": u.audio[None].astype(np.float32)} for u in utts]
    quantize_qdq(source, out_dir / VARIANT_FILE, feeds, ops=["Conv"], nodes=convs, symmetric=False)
    calibration = {
        "scheme": SCHEME,
        "method": "MinMax",
        "sentences": [u.text for u in utts],
        "voice": "packaged, default scales (training.lipsync.data.controls_for)",
        "seconds": round(sum(u.duration for u in utts), 2),
    }
    return judged_variant("lipsync", out_dir, feeds[0], gate, calibration)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(json.dumps(built_record("lipsync")[1], indent=1))


if __name__ == "__main__":
    main()
