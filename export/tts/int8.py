"""INT8 Q/DQ variant of `tts_vits`, built with each export and gated by what users hear.

Quantisation (`export.quantize`): Conv, ConvTranspose and MatMul, per-channel symmetric INT8
weights, symmetric INT8 activations (TensorRT's explicit-precision form), MinMax on the
chunks of CALIBRATION_SENTENCES with fixed noise (seed 99): reproducible; the sentences are
recorded in calibration.json beside the variant.

Gate: `evals.tts.int8_gate` on the 24 held-out WER_SENTENCES (never used for calibration):
what users hear (Whisper's word error rate), phoneme timing, sentence length, the same
durations in a batch as alone, and both graphs' real-time factor; the `tts_vits` config
serves the variant on the CPU where it passes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from avatar.tts.phonemes import Phonemizer, prepare
from avatar.tts.synth import Controls, batch_inputs
from avatar.tts.voice import packaged_voice
from export.common import onnx_session
from export.gates import CALIBRATION_FILE, judged_variant, variant_gate
from export.quantize import VARIANT_FILE, quantize_qdq

log = logging.getLogger(__name__)

CALIBRATION_SENTENCES = (
    "Calibration uses sentences that the word error rate does not.",
    "The orchestra tuned their instruments before the concert began.",
    "Can you tell me where the train station is, please?",
    "Seventeen small boats were anchored in the quiet harbour.",
    "Wow! That was the loudest thunder I have ever heard.",
    "Our meeting moved to half past three on Wednesday afternoon.",
)


def quantize(source: Path, out: Path) -> dict[str, np.ndarray]:
    """`source` (the FP32 export) -> INT8 Q/DQ `out`, calibrated on CALIBRATION_SENTENCES;
    returns the first calibration feed (the verdict's probe)."""
    voice = packaged_voice()
    phonemizer = Phonemizer(voice.config)
    controls = Controls.defaults(voice.config, seed=99)
    chunks = [c for s in CALIBRATION_SENTENCES for c in prepare(s, phonemizer).chunks]
    feeds = [batch_inputs([c.ids], [controls]) for c in chunks]
    # 8-bit weights: with 7 it failed its gate (WER 0.046 vs 0.014, a sentence 5.1 % longer)
    quantize_qdq(
        source, out, feeds, ops=["Conv", "ConvTranspose", "MatMul"], seven_bit_weights=False
    )
    return feeds[0]


def gate(fp32_path: Path, int8_path: Path) -> dict:
    """The gate's figures and verdict, and both graphs' real-time factors, as a record."""
    from evals.tts import int8_gate
    from export.asr.weights import packaged_ct2_dir

    paths = {"fp32": fp32_path, "int8": int8_path}
    record = int8_gate(
        {name: onnx_session(path) for name, path in paths.items()}, packaged_ct2_dir()
    )
    return {**record, "calibration": CALIBRATION_FILE}


gate_folder = variant_gate(gate)  # the gate of the variant in an artifact folder


def build_variant(out_dir: Path) -> dict:
    """model.onnx in `out_dir` -> model.int8.onnx + calibration.json; returns its verdict's
    record (export.gates: recorded, or measured by `gate`)."""
    out_dir = Path(out_dir)
    probe = quantize(out_dir / "model.onnx", out_dir / VARIANT_FILE)
    calibration = {"method": "MinMax", "seed": 99, "sentences": CALIBRATION_SENTENCES}
    return judged_variant("tts_vits", out_dir, probe, gate, calibration)
