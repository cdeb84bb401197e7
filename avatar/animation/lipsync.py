"""Audio-driven animation: per-frame viseme probabilities (the `lipsync` model) -> the
same viseme weights and ARKit-52 frames the TTS path makes from phoneme timings.

The model gives `viseme_probs` [T, 15] at FRAME_RATE (100 Hz). `decode_segments` smooths
them over a few frames, takes the most likely viseme per frame and merges runs shorter
than `min_duration` into a neighbour; each segment is then spoken as a representative
phoneme of its viseme (`tables.PHONEME_TO_VISEME`), so `animate()` applies exactly the
TTS path's coarticulation, lip closures, smoothing, emotion, blinks and head motion.
"""

from __future__ import annotations

import itertools

import numpy as np

from avatar.animation import tables
from avatar.animation.pipeline import Animation, AnimationConfig, animate
from avatar.animation.visemes import PhonemeTiming, VisemeSegment
from avatar.errors import RequestError

FRAME_RATE = 100.0  # model frames per second (networks/lipsync.py: HOP 160 at 16 kHz)
SILENCE_SYMBOL = "."  # punctuation: always a pause (tables.PUNCTUATION)
REPRESENTATIVE: dict[str, str] = {"sil": SILENCE_SYMBOL}
for _symbol, _viseme in tables.PHONEME_TO_VISEME.items():
    REPRESENTATIVE.setdefault(_viseme, _symbol)  # the first symbol the table lists


def check_probs(probs: np.ndarray) -> np.ndarray:
    """float64 [T, 15] of finite, non-negative rows; RequestError otherwise."""
    p = np.asarray(probs, dtype=np.float64)
    if p.ndim != 2 or p.shape[1] != len(tables.VISEMES):
        raise RequestError(
            f"viseme probabilities have shape {list(p.shape)}; expected [frames, "
            f"{len(tables.VISEMES)}] in tables.VISEMES order"
        )
    if not np.isfinite(p).all() or (p < 0).any():
        raise RequestError("viseme probabilities must be finite and non-negative")
    return p


def decode_segments(
    probs: np.ndarray,
    frame_rate: float = FRAME_RATE,
    smooth_frames: int = 3,
    min_duration: float = 0.03,
    keep: tuple[str, ...] = ("PP",),
) -> list[VisemeSegment]:
    """Viseme probabilities [T, 15] (frame i at i / frame_rate) -> segments covering them.

    A frame's viseme is the argmax of its probabilities averaged over `smooth_frames`
    frames; a run shorter than `min_duration` seconds joins the neighbour whose viseme it
    finds more likely, except runs of the `keep` visemes (a p/b/m closure can be shorter
    than 30 ms, and the lips must still touch). Segment k spans the frames' cells
    [start - 0.5, end + 0.5) / rate, clipped to [0, (T - 1) / rate].
    """
    p = check_probs(probs)
    if len(p) == 0:
        return []
    if smooth_frames > 1:
        kernel = np.ones(smooth_frames) / smooth_frames
        padded = np.pad(p, ((smooth_frames // 2, (smooth_frames - 1) // 2), (0, 0)), mode="edge")
        p = np.stack(
            [np.convolve(padded[:, c], kernel, mode="valid") for c in range(p.shape[1])], 1
        )
    labels = p.argmax(axis=1)
    runs = _runs(labels)
    min_frames = min_duration * frame_rate
    protected = {tables.VISEME_INDEX[v] for v in keep}
    while len(runs) > 1:
        lengths = [np.inf if v in protected else end - start for v, start, end in runs]
        k = int(np.argmin(lengths))
        if lengths[k] >= min_frames:
            break
        _, start, end = runs[k]
        options = [j for j in (k - 1, k + 1) if 0 <= j < len(runs)]
        j = max(options, key=lambda j: p[start:end, runs[j][0]].sum())
        runs[j] = (runs[j][0], min(start, runs[j][1]), max(end, runs[j][2]))
        del runs[k]
        runs = _merge_equal(runs)
    last = (len(p) - 1) / frame_rate
    return [
        VisemeSegment(
            tables.VISEMES[v],
            max(0.0, (start - 0.5) / frame_rate),
            min(last, (end - 0.5) / frame_rate) if end < len(p) else last,
        )
        for v, start, end in runs
    ]


def _runs(labels: np.ndarray) -> list[tuple[int, int, int]]:
    """(label, first frame, end frame exclusive) of each run of equal labels."""
    edges = np.flatnonzero(np.diff(labels)) + 1
    bounds = [0, *edges.tolist(), len(labels)]
    return [(int(labels[a]), a, b) for a, b in itertools.pairwise(bounds)]


def _merge_equal(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for run in runs:
        if out and out[-1][0] == run[0]:
            out[-1] = (run[0], out[-1][1], run[2])
        else:
            out.append(run)
    return out


def segments_to_timings(segments: list[VisemeSegment]) -> list[PhonemeTiming]:
    """Each segment as one representative phoneme of its viseme, same span."""
    return [PhonemeTiming(REPRESENTATIVE[s.viseme], s.start, s.end) for s in segments]


def animate_probs(
    probs: np.ndarray,
    config: AnimationConfig | None = None,
    frame_rate: float = FRAME_RATE,
    duration: float | None = None,
) -> Animation:
    """Viseme probabilities [T, 15] -> Animation at `config.fps` (the TTS path's frames).

    `duration` (s) defaults to the last model frame's time, (T - 1) / frame_rate.
    """
    segments = decode_segments(probs, frame_rate)
    end = segments[-1].end if segments else 0.0
    return animate(segments_to_timings(segments), config, duration=max(end, duration or 0.0))
