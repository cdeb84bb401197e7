"""The visemes the face shows, FP32 `lipsync` against its INT8 variant: the variant's gate
(export/lipsync/int8.py builds it and asks `int8_gate`).

On the 105 held-out sentences of training/lipsync/evaluate.py (never trained on or
calibrated with), scored against their phoneme timing (evals.lipsync):
- frame accuracy (15 visemes) within ACCURACY_POINTS of FP32's, clean and in white noise at
  10 dB SNR (the issue's bound: 1 point);
- p/b/m closures: the share of true bilabials the decoded visemes close the lips on at most
  CLOSURE_POINTS below FP32's (what a viewer sees first when lip sync is wrong).
Speed (FP32 and INT8 alternated in one run, 3-s windows as clients/lipsync.py sends them, batch
1 and 8, 1 thread) is recorded with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from evals import lipsync as evaluate
from evals.gate import faster, side_by_side, timed_ms, verdict
from evals.lipsync import Utterance

ACCURACY_POINTS = 0.01
CLOSURE_POINTS = 0.02  # 3 of the 148 held-out bilabials
CONDITIONS = ("clean", "white noise 10 dB SNR")
RUNS = 15
WINDOW_SAMPLES = 3 * 16_000


def int8_gate(sessions: Mapping[str, object], utts: list[Utterance]) -> dict:
    """The gate's verdict and figures, and both graphs' speed, for the ONNX Runtime
    `sessions` {"fp32": ..., "int8": ...} (1 thread each) on the held-out utterances `utts`
    (spoken by the packaged voice)."""
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
    speed = side_by_side(
        lambda name, batch: timed_ms(
            lambda: sessions[name].run(None, {audio_input: windows[:batch]})
        ),
        rounds=RUNS,
        warmup=True,
    )
    passed = "; ".join(
        f"{c} frame accuracy {a['int8']:.4f} vs FP32 {a['fp32']:.4f}" for c, a in accuracy.items()
    )
    return {
        **verdict(
            failures,
            f"{passed} (at most {ACCURACY_POINTS * 100:g} point lower); p/b/m closed "
            f"{closures['int8']:.3f} vs {closures['fp32']:.3f} (at most "
            f"{CLOSURE_POINTS * 100:g} points lower)",
        ),
        "heldout_sentences": len(utts),
        "frame_accuracy": {c: {n: round(v, 4) for n, v in a.items()} for c, a in accuracy.items()},
        "bilabials_closed": {n: round(v, 4) for n, v in closures.items()},
        "bilabials": clean["fp32"].bilabials,
        "speed_1_thread_3s_windows": speed,
        "faster": faster(speed),
    }
