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

Gate, on the 105 held-out sentences of training/lipsync/evaluate.py (never trained on or
calibrated with), scored against their phoneme timing:
- frame accuracy (15 visemes) within ACCURACY_POINTS of FP32's, clean and in white noise at
  10 dB SNR (the issue's bound: 1 point);
- p/b/m closures: the share of true bilabials the decoded visemes close the lips on at most
  CLOSURE_POINTS below FP32's (what a viewer sees first when lip sync is wrong).
Speed (FP32 and INT8 alternated in one run, 3-s windows as clients/lipsync.py sends them, batch
1 and 8, 1 thread) is recorded with the gate.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from export.common import onnx_session
from export.gates import judged
from export.quantize import VARIANT_FILE, built_record, faster, logged, quantize_qdq, side_by_side

log = logging.getLogger(__name__)

CALIBRATION_FILE = "calibration.json"
SCHEME = "minmax-conv-no-frontend-u8s8"
FRONT_END = ("/features/",)  # STFT Conv and mel MatMul stay FP32
CALIBRATION_SENTENCES = 12
ACCURACY_POINTS = 0.01
CLOSURE_POINTS = 0.02  # 3 of the 148 held-out bilabials
CONDITIONS = ("clean", "white noise 10 dB SNR")
RUNS = 15
WINDOW_SAMPLES = 3 * 16_000


def calibration_utterances() -> list:
    from evals.sentences import sentences
    from export.tts.utterances import load_or_synthesize

    return load_or_synthesize(sentences("train")[:CALIBRATION_SENTENCES], 1, varied=False)


def gate(fp32_path: Path, int8_path: Path) -> dict:
    """The gate's figures and verdict, and the speed of both graphs, as a sidecar record."""
    from evals import lipsync as evaluate
    from evals.sentences import sentences
    from export.tts.utterances import load_or_synthesize

    utts = load_or_synthesize(sentences("heldout"), 1, varied=False)
    sessions = {name: onnx_session(path, threads=1) for name, path in
                (("fp32", fp32_path), ("int8", int8_path))}  # fmt: skip
    (audio_input,) = (i.name for i in sessions["fp32"].get_inputs())
    scores = {}
    for name, session in sessions.items():

        def predict(audio: np.ndarray, session=session) -> np.ndarray:
            return session.run(["viseme_probs"], {audio_input: audio[None]})[0][0]

        scores[name] = {
            c: evaluate.run_condition(predict, utts, evaluate.CONDITIONS[c], fps=30.0)
            for c in CONDITIONS
        }
    accuracy = {c: {n: scores[n][c].accuracy for n in sessions} for c in CONDITIONS}
    clean = {n: scores[n]["clean"] for n in sessions}
    closures = {n: s.bilabials_closed / max(s.bilabials, 1) for n, s in clean.items()}
    failures = [
        f"{c} frame accuracy {a['int8']:.4f} vs FP32 {a['fp32']:.4f} (> {ACCURACY_POINTS} lower)"
        for c, a in accuracy.items()
        if a["int8"] < a["fp32"] - ACCURACY_POINTS
    ]
    if closures["int8"] < closures["fp32"] - CLOSURE_POINTS:
        failures.append(f"p/b/m closed {closures['int8']:.3f} vs FP32 {closures['fp32']:.3f}")
    # 3-s windows of held-out speech, as clients/lipsync.py sends them
    speech = np.concatenate([u.audio for u in utts[:8]]).astype(np.float32)
    windows = speech[: len(speech) // WINDOW_SAMPLES * WINDOW_SAMPLES].reshape(-1, WINDOW_SAMPLES)

    def call_ms(name: str, batch: int) -> float:
        audio = windows[:batch]
        started = time.perf_counter()
        sessions[name].run(None, {audio_input: audio})
        return 1000 * (time.perf_counter() - started)

    speed = side_by_side(call_ms, rounds=RUNS, warmup=True)
    passes = not failures
    return {
        "passes_gate": passes,
        "why": (
            "; ".join(
                f"{c} frame accuracy {a['int8']:.4f} vs FP32 {a['fp32']:.4f}"
                for c, a in accuracy.items()
            )
            + f" (at most {ACCURACY_POINTS * 100:g} point lower); p/b/m closed "
            f"{closures['int8']:.3f} vs {closures['fp32']:.3f} (at most "
            f"{CLOSURE_POINTS * 100:g} points lower)"
            if passes
            else "; ".join(failures)
        ),
        "scheme": SCHEME,
        "heldout_sentences": len(utts),
        "frame_accuracy": {c: {n: round(v, 4) for n, v in a.items()} for c, a in accuracy.items()},
        "bilabials_closed": {n: round(v, 4) for n, v in closures.items()},
        "bilabials": clean["fp32"].bilabials,
        "speed_1_thread_3s_windows": speed,
        "faster": faster(speed),
        "calibration": CALIBRATION_FILE,
    }


def gate_folder(folder: Path) -> dict:
    """The gate of the variant in the artifact `folder`."""
    return gate(Path(folder) / "model.onnx", Path(folder) / VARIANT_FILE)


def build_variant(out_dir: Path) -> dict:
    """model.onnx in `out_dir` -> model.int8.onnx + calibration.json; returns its verdict's
    record (export.gates: recorded, or measured by `gate`)."""
    import onnx

    out_dir = Path(out_dir)
    source = out_dir / "model.onnx"
    utts = calibration_utterances()
    (out_dir / CALIBRATION_FILE).write_text(
        json.dumps(
            {
                "scheme": SCHEME,
                "method": "MinMax",
                "sentences": [u.text for u in utts],
                "voice": "packaged, default scales (training.lipsync.data.controls_for)",
                "seconds": round(sum(u.duration for u in utts), 2),
            },
            indent=1,
        )
    )
    graph = onnx.load(str(source), load_external_data=False).graph
    convs = [n.name for n in graph.node if n.op_type == "Conv" and not n.name.startswith(FRONT_END)]
    feeds = [{"audio": u.audio[None].astype(np.float32)} for u in utts]
    quantize_qdq(source, out_dir / VARIANT_FILE, feeds, ops=["Conv"], nodes=convs, symmetric=False)
    variant = out_dir / VARIANT_FILE
    return logged("lipsync", judged("lipsync", variant, feeds[0], lambda: gate(source, variant)))


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(json.dumps(built_record("lipsync")[1], indent=1))


if __name__ == "__main__":
    main()
