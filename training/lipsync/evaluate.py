"""Held-out figures of the lipsync model against phoneme-timed ground truth:
`python -m training.lipsync.train --evaluate` (the scores are `evals.lipsync`'s).

The held-out set is the 105 'heldout' sentences of emotion_sentences.json (written
separately from the training sentences, never trained on), spoken by the same Piper
voice with its default scales and unseen seeds. Conditions (`evals.lipsync.CONDITIONS`):
clean; gain and noise; an 8 kHz band limit; and a "different speaker" made by resampling
(pitch, formants and tempo x0.85 / x1.15, outside the x0.92-1.08 used in training). A second
set is the same held-out sentences from espeak-ng formant voices never trained on
(EVAL_VOICES; other espeak voices are in the training data), labelled by espeak's own
phoneme events. None is a human recording: those figures would likely be lower.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evals.lipsync import (
    CONDITIONS,
    ESPEAK_CONDITIONS,
    Predict,
    Scores,
    confusion_summary,
    report,
    run_condition,
)
from evals.sentences import sentences
from export.tts.utterances import load_or_synthesize
from training.lipsync import espeak


def torch_predict(weights: Path) -> Predict:
    import torch

    from networks.lipsync import load_model

    torch.set_num_threads(1)
    model = load_model(weights)

    def predict(audio: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            probs, _ = model(torch.from_numpy(audio)[None])
        return probs[0].numpy()

    return predict


def evaluate(weights: Path, fps: float = 30.0, limit: int | None = None) -> dict[str, Scores]:
    """Print the figures of every condition; returns them."""
    utts = load_or_synthesize(sentences("heldout"), 1, varied=False)[:limit]
    predict = torch_predict(weights)
    print(f"held-out: {len(utts)} sentences never trained on ({sum(u.duration for u in utts):.0f}"
          " s), same Piper voice, default scales")  # fmt: skip
    results = {}
    for name, aug in CONDITIONS.items():
        results[name] = run_condition(predict, utts, aug, fps)
        print("\n".join(report(name, results[name], fps)))
    other = espeak.load_or_speak(sentences("heldout"), espeak.EVAL_VOICES)[:limit]
    for name, aug in ESPEAK_CONDITIONS.items():
        results[name] = run_condition(predict, other, aug, fps)
        print("\n".join(report(name, results[name], fps)))
    for name in ("clean", next(iter(ESPEAK_CONDITIONS))):
        print(f"confusions ({name}):")
        print("\n".join(confusion_summary(results[name])))
    return results
