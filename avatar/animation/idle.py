"""Life between and during sentences: blinks, gaze saccades and idle head motion (seeded).

Head motion is a sum of slow sinusoids evaluated on the session clock (`t0` + frame time),
so consecutive sentences join without a jump; blinks and saccades are drawn from a seeded
generator. Rates follow the literature loosely: ~15-20 blinks/min at rest (Bentivoglio et
al. 1997), blink ~150 ms with a faster closing than opening phase.
"""

from __future__ import annotations

import numpy as np

from avatar.animation.tables import ARKIT_INDEX

BLINK_CLOSE_S, BLINK_HOLD_S, BLINK_OPEN_S = 0.06, 0.03, 0.1
BLINK_INTERVAL_S = (2.0, 5.0)  # uniform range between blinks
HEAD_AMPLITUDE_RAD = np.radians([3.0, 2.0, 1.5])  # yaw, pitch, roll
HEAD_FREQUENCIES_HZ = np.array([0.11, 0.23, 0.37])
GAZE_INTERVAL_S = (0.8, 2.5)
GAZE_RANGE = 0.25  # eyeLook* weight of the widest saccade


def blink_curve(times: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, list[float]]:
    """Eyelid closure [T] in 0..1 and the blink start times (s) for frame `times` [T]."""
    closure = np.zeros(len(times))
    starts: list[float] = []
    if len(times) == 0:
        return closure, starts
    t = times[0] + rng.uniform(0.3, BLINK_INTERVAL_S[1])
    while t < times[-1]:
        starts.append(float(t))
        rel = times - t
        closing = np.clip(rel / BLINK_CLOSE_S, 0, 1)
        opening = np.clip(1 - (rel - BLINK_CLOSE_S - BLINK_HOLD_S) / BLINK_OPEN_S, 0, 1)
        closure = np.maximum(closure, np.minimum(closing, opening) * (rel >= 0))
        t += rng.uniform(*BLINK_INTERVAL_S)
    return closure, starts


def head_pose(times: np.ndarray, t0: float, rng: np.random.Generator) -> np.ndarray:
    """Idle head rotation (yaw, pitch, roll) in radians [T, 3] on the session clock."""
    phases = rng.uniform(0, 2 * np.pi, size=(3, 3))  # [angle, harmonic]
    clock = (t0 + times)[:, None, None]
    waves = np.sin(2 * np.pi * HEAD_FREQUENCIES_HZ[None, None, :] * clock + phases[None])
    return (waves.mean(axis=2) * HEAD_AMPLITUDE_RAD[None, :]).astype(np.float64)


def gaze(times: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Piecewise-constant gaze as (horizontal, vertical) in -1..1 [T, 2] (saccades)."""
    out = np.zeros((len(times), 2))
    if len(times) == 0:
        return out
    t = times[0]
    target = np.zeros(2)
    while t <= times[-1]:
        out[times >= t] = target
        target = rng.uniform(-1, 1, size=2) * np.array([1.0, 0.5])
        t += rng.uniform(*GAZE_INTERVAL_S)
    return out


def apply_eyes(blendshapes: np.ndarray, blink: np.ndarray, look: np.ndarray) -> np.ndarray:
    """Write blinks [T] and gaze [T, 2] (+x = avatar's left, +y = up) into [T, 52]."""
    out = blendshapes.copy()
    for side in ("Left", "Right"):
        out[:, ARKIT_INDEX[f"eyeBlink{side}"]] = np.maximum(
            out[:, ARKIT_INDEX[f"eyeBlink{side}"]], blink
        )
        # Looking towards the avatar's left: left eye looks out, right eye looks in.
        towards_left = np.clip(look[:, 0], 0, None) * GAZE_RANGE
        towards_right = np.clip(-look[:, 0], 0, None) * GAZE_RANGE
        out_w, in_w = (
            (towards_left, towards_right) if side == "Left" else (towards_right, towards_left)
        )
        out[:, ARKIT_INDEX[f"eyeLookOut{side}"]] += out_w
        out[:, ARKIT_INDEX[f"eyeLookIn{side}"]] += in_w
        out[:, ARKIT_INDEX[f"eyeLookUp{side}"]] += np.clip(look[:, 1], 0, None) * GAZE_RANGE
        out[:, ARKIT_INDEX[f"eyeLookDown{side}"]] += np.clip(-look[:, 1], 0, None) * GAZE_RANGE
    return out
