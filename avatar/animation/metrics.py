"""Measurements of an animation against its phoneme timings (used by tests and reports)."""

from __future__ import annotations

import itertools

import numpy as np

from avatar.animation.emotion import mouth_opening
from avatar.animation.pipeline import VISEME_TO_ARKIT_MATRIX, Animation
from avatar.animation.tables import CLOSED_VISEMES, VISEME_INDEX

ONSET_FRACTION = 0.5  # the mouth "opens" when it reaches this fraction of the segment's peak


def onset_errors(animation: Animation, min_frames: float = 2.0) -> np.ndarray:
    """Mouth-opening onset error in frames for every segment that follows a closure [N].

    For each open segment preceded by a closed one (p, b, m or a pause) and lasting at least
    `min_frames`, the onset is the time (linearly interpolated between frames) at which the
    mouth opening first reaches ONSET_FRACTION of its peak within the segment; the error is
    that time minus the segment start, in frames (positive: late). The peak is the
    segment's own target opening (its viseme alone), or the largest opening reached inside
    the segment if blending with its neighbours keeps it lower.
    """
    opening = mouth_opening(animation.blendshapes)
    times, fps = animation.times, animation.fps
    errors = []
    segs = animation.segments
    for previous, seg in itertools.pairwise(segs):
        if previous.viseme not in CLOSED_VISEMES or seg.viseme in CLOSED_VISEMES:
            continue
        if (seg.end - seg.start) * fps < min_frames:
            continue
        window = (times >= previous.start) & (times < seg.end)
        idx = np.flatnonzero(window)
        inside = idx[times[idx] >= seg.start]
        if len(inside) == 0:
            continue
        target = mouth_opening(VISEME_TO_ARKIT_MATRIX[VISEME_INDEX[seg.viseme]])
        threshold = ONSET_FRACTION * min(target, opening[inside].max())
        above = idx[(opening[idx] >= threshold) & (times[idx] >= previous.center)]
        if len(above) == 0:
            continue
        i = above[0]
        if i == 0 or opening[i - 1] >= threshold:
            crossing = times[i]
        else:
            frac = (threshold - opening[i - 1]) / (opening[i] - opening[i - 1])
            crossing = times[i - 1] + frac * (times[i] - times[i - 1])
        errors.append((crossing - seg.start) * fps)
    return np.asarray(errors)


def closure_violations(animation: Animation, tolerance: float = 0.02) -> np.ndarray:
    """Indices of frames marked closed whose mouth opening exceeds `tolerance` [K]."""
    opening = mouth_opening(animation.blendshapes)
    return np.flatnonzero(animation.closed & (opening > tolerance))
