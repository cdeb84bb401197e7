"""Held-out figures of the lipsync model against phoneme-timed ground truth.

The held-out set is the 105 'heldout' sentences of emotion_sentences.json (written
separately from the training sentences, never trained on), spoken by the same Piper
voice with its default scales and unseen seeds. Conditions: clean; gain and noise;
an 8 kHz band limit; and a "different speaker" made by resampling (pitch, formants and
tempo x0.85 / x1.15, outside the x0.92-1.08 used in training). A second set is the same
held-out sentences from espeak-ng formant voices never trained on (EVAL_VOICES; other
espeak voices are in the training data), labelled by espeak's own phoneme events. None is
a human recording: those figures would likely be lower.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np

from avatar.animation import tables
from avatar.animation.lipsync import animate_probs, decode_segments
from avatar.animation.metrics import onset_errors
from avatar.animation.pipeline import AnimationConfig
from training.lipsync import espeak
from training.lipsync.data import (
    FRAME_RATE,
    Augment,
    Utterance,
    augment,
    frame_targets,
    label_segments,
    load_or_synthesize,
    sentences,
)

# Collapsed groups: what the lips do.
GROUPS: dict[str, tuple[str, ...]] = {
    "closed": ("sil", "PP"),
    "open": ("aa", "E", "ih"),
    "rounded": ("oh", "ou", "RR", "CH"),
    "teeth/tongue": ("FF", "TH", "DD", "kk", "SS", "nn"),
}
GROUP_OF = np.array(
    [next(i for i, g in enumerate(GROUPS.values()) if v in g) for v in tables.VISEMES]
)
CLOSED = np.array([v in tables.CLOSED_VISEMES for v in tables.VISEMES])
CONDITIONS: dict[str, Augment] = {
    "clean": Augment(),
    "-12 dB gain, pink noise 15 dB SNR": Augment(gain_db=-12.0, snr_db=15.0, pink=True),
    "white noise 10 dB SNR": Augment(snr_db=10.0),
    "8 kHz band limit": Augment(band="8k"),
    "other speaker x0.85 (lower, slower)": Augment(shift=0.85),
    "other speaker x1.15 (higher, faster)": Augment(shift=1.15),
}
ESPEAK_CONDITIONS: dict[str, Augment] = {
    "espeak-ng unseen voices (m7, f4, m2, f5), clean": Augment(),
    "espeak-ng unseen voices, white noise 15 dB SNR": Augment(snr_db=15.0),
}
Predict = Callable[[np.ndarray], np.ndarray]  # audio [n] at 16 kHz -> probs [T, 15]


@dataclasses.dataclass
class Scores:
    """Frame counts and onset errors accumulated over clips."""

    confusion: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((15, 15), int))
    onsets_100hz: list[float] = dataclasses.field(default_factory=list)
    onset_misses: int = 0
    onsets_fps: list[float] = dataclasses.field(default_factory=list)
    bilabials: int = 0  # true p/b/m segments
    bilabials_closed: int = 0  # ... overlapped by a decoded PP segment
    closures: int = 0  # decoded PP segments
    closures_real: int = 0  # ... overlapping a true p/b/m or pause

    @property
    def accuracy(self) -> float:
        return float(np.trace(self.confusion) / self.confusion.sum())

    @property
    def collapsed_accuracy(self) -> float:
        same = GROUP_OF[:, None] == GROUP_OF[None, :]
        return float(self.confusion[same].sum() / self.confusion.sum())

    @property
    def closed_f1(self) -> float:
        c = self.confusion
        tp = c[np.ix_(CLOSED, CLOSED)].sum()
        precision, recall = tp / max(c[:, CLOSED].sum(), 1), tp / max(c[CLOSED].sum(), 1)
        return float(2 * precision * recall / max(precision + recall, 1e-12))


def mouth_onsets(labels: np.ndarray, min_open: int = 3) -> np.ndarray:
    """Frames where the mouth opens (closed run -> open run of >= min_open frames) [K]."""
    closed = CLOSED[labels]
    starts = np.flatnonzero(closed[:-1] & ~closed[1:]) + 1
    return np.array([s for s in starts if not closed[s : s + min_open].any()], int)


def score_clip(scores: Scores, probs: np.ndarray, utt: Utterance, scale: float, fps: float) -> None:
    """Add one clip: probs [T, 15] at 100 Hz against the labels of `utt` (timeline * scale)."""
    truth, _ = frame_targets(utt, len(probs), scale)
    decoded = np.zeros(len(probs), int)
    segments = decode_segments(probs)
    _count_closures(scores, segments, label_segments(utt, scale))
    for seg in segments:
        first = int(np.ceil(seg.start * FRAME_RATE - 1e-9))
        decoded[first : int(np.ceil(seg.end * FRAME_RATE - 1e-9)) + 1] = tables.VISEME_INDEX[
            seg.viseme
        ]
    np.add.at(scores.confusion, (truth, decoded), 1)
    predicted = mouth_onsets(decoded, min_open=1)
    for onset in mouth_onsets(truth):
        near = predicted[np.abs(predicted - onset) <= 10]
        if len(near) == 0:
            scores.onset_misses += 1
        else:
            scores.onsets_100hz.append(float(near[np.argmin(np.abs(near - onset))] - onset))
    anim = animate_probs(probs, AnimationConfig(fps=fps, blinks=False))
    truth_anim = dataclasses.replace(anim, segments=label_segments(utt, scale))
    scores.onsets_fps.extend(onset_errors(truth_anim).tolist())


def _count_closures(scores: Scores, predicted: list, truth: list) -> None:
    def overlaps(seg, others) -> bool:
        return any(o.start < seg.end and seg.start < o.end for o in others)

    closed_pred = [s for s in predicted if s.viseme == "PP"]
    closed_true = [s for s in truth if s.viseme in tables.CLOSED_VISEMES]
    true_pp = [s for s in truth if s.viseme == "PP"]
    scores.bilabials += len(true_pp)
    scores.bilabials_closed += sum(overlaps(s, closed_pred) for s in true_pp)
    scores.closures += len(closed_pred)
    scores.closures_real += sum(overlaps(s, closed_true) for s in closed_pred)


def run_condition(predict: Predict, utts: list[Utterance], aug: Augment, fps: float) -> Scores:
    rng = np.random.default_rng(7)
    scores = Scores()
    for utt in utts:
        audio, scale = augment(utt, aug, rng)
        score_clip(scores, predict(audio), utt, scale, fps)
    return scores


def report(name: str, s: Scores, fps: float) -> list[str]:
    o100, ofps = np.abs(s.onsets_100hz), np.abs(s.onsets_fps)
    found = len(o100) / max(len(o100) + s.onset_misses, 1)
    lines = [
        f"{name}: {s.confusion.sum()} frames",
        f"  frame accuracy (15 visemes) {s.accuracy:.3f}; collapsed ({'/'.join(GROUPS)}) "
        f"{s.collapsed_accuracy:.3f}; mouth-closed (sil+PP) F1 {s.closed_f1:.3f}",
        f"  mouth-open onsets at 100 Hz: {found:.0%} found within 10 frames; |error| median "
        f"{np.median(o100):.1f}, mean {np.mean(o100):.2f} frames (10 ms); "
        f"{np.mean(o100 <= 3):.0%} within 3",
        f"  p/b/m segments with a decoded closure {s.bilabials_closed}/{s.bilabials} "
        f"({s.bilabials_closed / max(s.bilabials, 1):.0%}); decoded closures on a true p/b/m or "
        f"pause {s.closures_real}/{s.closures} ({s.closures_real / max(s.closures, 1):.0%})",
        f"  onset error at {fps:g} fps (avatar.animation.metrics.onset_errors, true segments): "
        f"mean |err| {np.mean(ofps):.2f} frames, {np.mean(ofps <= 1):.0%} <= 1 frame "
        f"(n={len(ofps)})",
    ]
    return lines


def confusion_summary(s: Scores, top: int = 8) -> list[str]:
    c = s.confusion
    recall = np.diag(c) / np.maximum(c.sum(1), 1)
    lines = ["  recall per viseme: " + ", ".join(
        f"{v} {r:.2f}" for v, r in zip(tables.VISEMES, recall, strict=True))]  # fmt: skip
    off = [(c[i, j] / max(c[i].sum(), 1), i, j) for i, j in itertools.permutations(range(15), 2)]
    worst = sorted(off, reverse=True)[:top]
    lines.append("  most frequent confusions (share of the true viseme's frames): " + ", ".join(
        f"{tables.VISEMES[i]}->{tables.VISEMES[j]} {f:.0%}" for f, i, j in worst))  # fmt: skip
    return lines


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
