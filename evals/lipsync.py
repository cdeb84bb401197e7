"""The lipsync data set and its scores: speech with phoneme timings, frame labels, the
audio conditions, and held-out figures against the labels.

An `Utterance` is a sentence's audio with the time of every phoneme (from the TTS's own
durations, or espeak-ng's phoneme events); the label of each audio frame is the viseme the
TTS path animates there (`avatar.animation.visemes.phonemes_to_segments`, the same tables).

Augmentation (`augment`) turns one utterance into the 16 kHz audio a user might send:
pitch/formant and tempo shift by resampling (labels scaled exactly), gain, additive
white/pink noise at an SNR, band limiting through 8 kHz or a 16 k <-> 22.05 k round trip,
trailing digital silence. Training draws it at random (`Augment.draw`); evaluation uses the
fixed `CONDITIONS`.

Scores (`Scores`, `score_clip`, `run_condition`): frame accuracy over the 15 visemes and
over collapsed groups, mouth-closed F1, mouth-open onset errors at 100 Hz and at a video
frame rate, and p/b/m closures.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np

from avatar.animation import tables
from avatar.animation.emotion import mouth_opening
from avatar.animation.lipsync import animate_probs, decode_segments
from avatar.animation.metrics import onset_errors
from avatar.animation.pipeline import VISEME_TO_ARKIT_MATRIX, AnimationConfig
from avatar.animation.visemes import (
    VisemeSegment,
    closure_mask,
    phonemes_to_segments,
    viseme_weights,
)
from avatar.audio import resample

SAMPLE_RATE = 16000
FRAME_RATE = 100  # label/model frames per second (hop 160 samples at 16 kHz)
SILENT_SYMBOLS = {"^": ".", "$": "."}  # Piper's leading/trailing silence is a pause


@dataclasses.dataclass(frozen=True)
class Utterance:
    """One synthesized sentence: native-rate audio [samples] and its phoneme timings (s)."""

    text: str
    audio: np.ndarray  # float32, at `rate`
    rate: int
    phonemes: tuple[str, ...]
    starts: np.ndarray  # float64 [P]
    ends: np.ndarray  # float64 [P]

    @property
    def duration(self) -> float:
        return self.audio.size / self.rate


def label_segments(utt: Utterance, scale: float = 1.0) -> list[VisemeSegment]:
    """The viseme segments the TTS path animates for `utt`, timeline times `scale`."""
    symbols = [SILENT_SYMBOLS.get(p, p) for p in utt.phonemes]
    return phonemes_to_segments(
        list(zip(symbols, utt.starts * scale, utt.ends * scale, strict=True))
    )


def frame_targets(utt: Utterance, frames: int, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Labels at FRAME_RATE: viseme class int64 [frames] and mouth opening float32 [frames].

    `scale` stretches the timeline (audio played 1/scale times faster has times * scale).
    Frame i is centred at i / FRAME_RATE (the model's STFT frames are centred); its label is
    the viseme segment there;
    the opening is the TTS path's (unsmoothed) blend of visemes with lip closures enforced.
    """
    segments = label_segments(utt, scale)
    centres = np.arange(frames) / FRAME_RATE
    ends = np.array([s.end for s in segments])
    which = np.minimum(np.searchsorted(ends, centres, side="right"), len(segments) - 1)
    labels = np.array([tables.VISEME_INDEX[segments[k].viseme] for k in which], np.int64)
    weights = viseme_weights(segments, centres)
    closed, closer = closure_mask(segments, centres)
    weights[closed] = 0.0
    weights[closed, closer[closed]] = 1.0
    opening = mouth_opening(weights @ VISEME_TO_ARKIT_MATRIX)
    return labels, opening.astype(np.float32)


def save_utterances(path: Path, utts: list[Utterance]) -> None:
    lengths = np.array([u.audio.size for u in utts])
    counts = np.array([len(u.phonemes) for u in utts])
    pcm = np.concatenate([np.clip(u.audio, -1, 1) * 32767 for u in utts]).astype(np.int16)
    np.savez(
        path, pcm=pcm, lengths=lengths, counts=counts, rate=np.array([utts[0].rate]),
        texts=np.array([u.text for u in utts]),
        phonemes=np.array([p for u in utts for p in u.phonemes]),
        starts=np.concatenate([u.starts for u in utts]),
        ends=np.concatenate([u.ends for u in utts]),
    )  # fmt: skip


def load_utterances(path: Path) -> list[Utterance]:
    with np.load(path) as npz:
        data = {name: npz[name] for name in npz.files}  # each npz[name] reads the file again
    a = np.concatenate([[0], np.cumsum(data["lengths"])])
    p = np.concatenate([[0], np.cumsum(data["counts"])])
    rate, pcm, phonemes = int(data["rate"][0]), data["pcm"], data["phonemes"].tolist()
    return [
        Utterance(str(text), pcm[a[k] : a[k + 1]].astype(np.float32) / 32767, rate,
                  tuple(phonemes[p[k] : p[k + 1]]),
                  data["starts"][p[k] : p[k + 1]], data["ends"][p[k] : p[k + 1]])
        for k, text in enumerate(data["texts"])
    ]  # fmt: skip


# ------------------------------------------------------------------------ augmentation


@dataclasses.dataclass(frozen=True)
class Augment:
    """One draw of the augmentation: `shift` > 1 raises pitch/formants and speeds up."""

    shift: float = 1.0
    gain_db: float = 0.0
    snr_db: float | None = None  # None: no added noise
    pink: bool = False
    band: str = "full"  # "full", "8k" (telephone-like 8 kHz round trip), "22k" round trip
    zeros_s: float = 0.0  # digital silence appended (a padded recording), labelled sil

    @classmethod
    def draw(cls, rng: np.random.Generator) -> Augment:
        return cls(
            shift=float(rng.uniform(0.92, 1.08)) if rng.uniform() < 0.7 else 1.0,
            gain_db=float(rng.uniform(-24.0, 6.0)),
            snr_db=None if rng.uniform() < 0.3 else float(rng.choice([30.0, 20.0, 15.0, 10.0])),
            pink=bool(rng.uniform() < 0.5),
            band=str(rng.choice(["full", "full", "8k", "22k"])),
            zeros_s=0.0 if rng.uniform() < 0.7 else float(rng.uniform(0.0, 0.5)),
        )


def augment(utt: Utterance, aug: Augment, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """16 kHz float32 audio [n] of `utt` under `aug`, and the timeline scale for its labels."""
    ratio = Fraction(aug.shift).limit_denominator(50)
    # Reading audio at rate*shift as if it were at rate: pitch, formants and tempo * shift.
    audio = resample(utt.audio, round(utt.rate * ratio.numerator), SAMPLE_RATE * ratio.denominator)
    if aug.band == "8k":
        audio = resample(resample(audio, SAMPLE_RATE, 8000), 8000, SAMPLE_RATE)
    elif aug.band == "22k":
        audio = resample(resample(audio, SAMPLE_RATE, 22050), 22050, SAMPLE_RATE)
    audio = audio * np.float32(10 ** (aug.gain_db / 20))
    if aug.snr_db is not None:
        noise = rng.standard_normal(audio.size).astype(np.float32)
        if aug.pink:  # 1/f power: integrate white noise with a leak, then whiten the level
            noise = np.cumsum(noise) * 0.02
            noise -= np.convolve(noise, np.ones(400) / 400, mode="same")
        speech_power = float(np.mean(audio**2)) + 1e-12
        noise *= np.sqrt(speech_power / (np.mean(noise**2) + 1e-12) / 10 ** (aug.snr_db / 10))
        audio = audio + noise
    audio = np.concatenate([audio, np.zeros(round(aug.zeros_s * SAMPLE_RATE), np.float32)])
    return np.clip(audio, -1.0, 1.0).astype(np.float32), float(1.0 / float(ratio))


# ----------------------------------------------------------------------------- scores

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
