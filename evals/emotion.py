"""The emotion a sentence's face shows, FP32 encoder against its INT8 variant: the gate of
`emotion_encoder`'s variant (export/emotion/int8.py builds it and asks `int8_gate`).

On the 105 held-out sentences of `emotion_sentences.json` (what the user sees is the face's
emotion and its strength, not the embedding):
- accuracy against the sentences' labels at most ACCURACY_DROP below FP32's;
- the same label as FP32 for at least MIN_AGREEMENT of the sentences;
- the intensity (0..1, what the face is scaled by) within MAX_INTENSITY_MAD of FP32's on
  average.
Speed (FP32 and INT8 alternated in one run, median of RUNS calls, batch 1 and 8) is recorded
with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from avatar.animation.emotion_classifier import EmotionClassifier, SentenceTokenizer
from avatar.animation.tables import EMOTIONS
from evals.gate import faster, side_by_side, timed_ms, verdict
from evals.sentences import load_sentences

ACCURACY_DROP = 0.02  # 2 of 105 held-out sentences
MIN_AGREEMENT = 0.95
MAX_INTENSITY_MAD = 0.05
RUNS = 30


def int8_gate(sessions: Mapping[str, object]) -> dict:
    """The gate's verdict and figures, and both graphs' speed (1 thread), for the ONNX
    Runtime `sessions` {"fp32": ..., "int8": ...} of the encoder (output `embedding`)."""
    tokenize = SentenceTokenizer()
    texts, truth = load_sentences()["heldout"]
    labels, strength = {}, {}
    for name, session in sessions.items():

        def embed(batch: list[str], session=session) -> np.ndarray:
            return session.run(["embedding"], tokenize(batch))[0]

        emotions = EmotionClassifier.load(encoder=embed).predict_batch(texts)
        labels[name], strength[name] = [e.label for e in emotions], [e.intensity for e in emotions]
    accuracy = {
        name: float(np.mean([EMOTIONS[t] == label for t, label in zip(truth, got, strict=True)]))
        for name, got in labels.items()
    }
    agreement = float(np.mean([a == b for a, b in zip(*labels.values(), strict=True)]))
    intensity_mad = float(np.mean(np.abs(np.subtract(strength["fp32"], strength["int8"]))))
    failures = []
    if accuracy["int8"] < accuracy["fp32"] - ACCURACY_DROP:
        failures.append(f"accuracy {accuracy['int8']:.3f} < FP32 {accuracy['fp32']:.3f} - "
                        f"{ACCURACY_DROP}")  # fmt: skip
    if agreement < MIN_AGREEMENT:
        failures.append(f"labels as FP32 {agreement:.3f} < {MIN_AGREEMENT}")
    if intensity_mad > MAX_INTENSITY_MAD:
        failures.append(f"intensity mean |diff| {intensity_mad:.3f} > {MAX_INTENSITY_MAD}")

    def call_ms(name: str, batch: int) -> float:
        feed = tokenize(list(texts[:batch]))
        return timed_ms(lambda: sessions[name].run(None, feed))

    speed = side_by_side(call_ms, rounds=RUNS, warmup=True)
    return {
        **verdict(
            failures,
            f"held-out accuracy {accuracy['int8']:.3f} vs FP32 {accuracy['fp32']:.3f} "
            f"(at most {ACCURACY_DROP} lower), labels as FP32 {agreement:.3f} "
            f"(>= {MIN_AGREEMENT}), intensity mean |diff| {intensity_mad:.3f} "
            f"(<= {MAX_INTENSITY_MAD})",
        ),
        "heldout_sentences": len(texts),
        "accuracy": {k: round(v, 4) for k, v in accuracy.items()},
        "labels_as_fp32": round(agreement, 4),
        "intensity_mad": round(intensity_mad, 4),
        "speed_1_thread": speed,
        "faster": faster(speed),
    }
