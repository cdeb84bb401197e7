"""Emotion label + intensity -> ARKit-52 offsets (FACS table), blended with speech.

The blend adds the emotion's weights scaled by intensity, except that on frames where
the lips must be closed (p, b, m, pauses) the shapes that open the lips are left as the
speech set them, so a surprised jaw drop never breaks a bilabial closure.
"""

from __future__ import annotations

import numpy as np

from avatar.animation import tables
from avatar.errors import RequestError

LIP_OPENING_INDEX = np.array([tables.ARKIT_INDEX[n] for n in tables.LIP_OPENING])


def emotion_vector(label: str, intensity: float) -> np.ndarray:
    """ARKit weights [52] of `label` at `intensity` (0..1), via EMOTION_TO_AU and AU_TO_ARKIT."""
    if label not in tables.EMOTION_TO_AU:
        raise RequestError(f"unknown emotion {label!r}; expected one of {list(tables.EMOTIONS)}")
    if not 0.0 <= float(intensity) <= 1.0:
        raise RequestError(f"emotion intensity {intensity} is out of range; expected 0..1")
    out = np.zeros(len(tables.ARKIT_NAMES))
    for au, strength in tables.EMOTION_TO_AU[label].items():
        for name, weight in tables.AU_TO_ARKIT[au].items():
            out[tables.ARKIT_INDEX[name]] += strength * weight
    return np.clip(out * float(intensity), 0.0, 1.0)


def blend_emotion(
    speech: np.ndarray, label: str, intensity: float, closed: np.ndarray, envelope: np.ndarray
) -> np.ndarray:
    """speech [T, 52] + emotion scaled by `envelope` [T] (0..1 ramp) -> [T, 52] in 0..1.

    `closed` [T] bool: frames whose lip-opening shapes must stay as in `speech`.
    """
    offset = envelope[:, None] * emotion_vector(label, intensity)[None, :]
    offset[np.ix_(np.asarray(closed, dtype=bool), LIP_OPENING_INDEX)] = 0.0
    return np.clip(speech + offset, 0.0, 1.0)


def mouth_opening(blendshapes: np.ndarray) -> np.ndarray:
    """How far the lips are apart, 0 (closed) .. ~1, from ARKit weights [..., 52] -> [...].

    jawOpen minus mouthClose (ARKit's lips-together-with-open-jaw), plus the lip raisers
    and depressors; lip pressing cancels it. The renderer draws the same quantity.
    """
    w = np.asarray(blendshapes)
    idx = tables.ARKIT_INDEX
    jaw = np.clip(w[..., idx["jawOpen"]] - w[..., idx["mouthClose"]], 0.0, None)
    lips = 0.25 * (
        w[..., idx["mouthLowerDownLeft"]] + w[..., idx["mouthLowerDownRight"]]
        + w[..., idx["mouthUpperUpLeft"]] + w[..., idx["mouthUpperUpRight"]]
    )  # fmt: skip
    press = 0.5 * (w[..., idx["mouthPressLeft"]] + w[..., idx["mouthPressRight"]])
    return np.clip((jaw + 0.5 * lips) * (1.0 - press), 0.0, None)
