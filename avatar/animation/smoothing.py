"""Exponential moving average per blendshape with attack/release asymmetry.

`y[t] = a * y[t-1] + (1 - a) * x[t]` with `a = alpha` when a weight falls (release: calm,
0.5 responsive ... 0.9 calm) and `a = attack` when it rises, so that a mouth opening is
not delayed: with the default attack (0.15) a step reaches 85 % of its height in the
frame where it starts. Frames marked `hard` (lip closures) are taken as they are and reset
the filter, so smoothing never holds the lips apart where they must close. Shapes that
press the lips together (mouthClose, mouthPress, mouthRoll) have the opposite polarity:
they are released fast when the mouth opens.
"""

from __future__ import annotations

import numpy as np

from avatar.errors import RequestError

DEFAULT_ATTACK = 0.15
ALPHA_RANGE = (0.0, 0.95)


def check_alpha(alpha: float, name: str = "alpha") -> float:
    low, high = ALPHA_RANGE
    if not (low <= float(alpha) <= high):
        raise RequestError(
            f"{name}={alpha} is out of range; expected {low} <= {name} <= {high} "
            "(0.5 responsive ... 0.9 calm)"
        )
    return float(alpha)


def ema(
    frames: np.ndarray,
    alpha: float,
    attack: float | None = DEFAULT_ATTACK,
    hard: np.ndarray | None = None,
    polarity: np.ndarray | None = None,
) -> np.ndarray:
    """Smooth `frames` [T, C] along time; `hard` [T] bool marks frames passed through.

    `polarity` [C] of +1/-1: -1 marks channels that close the mouth (lip press), whose
    *fall* is the attack. `attack=None` uses `alpha` both ways (a plain EMA).
    Returns [T, C] float64.
    """
    alpha = check_alpha(alpha)
    attack_a = alpha if attack is None else min(check_alpha(attack, "attack"), alpha)
    x = np.asarray(frames, dtype=np.float64)
    out = np.empty_like(x)
    if len(x) == 0:
        return out
    hard = np.zeros(len(x), dtype=bool) if hard is None else np.asarray(hard, dtype=bool)
    sign = np.ones(x.shape[1]) if polarity is None else np.asarray(polarity, dtype=np.float64)
    state = x[0].copy()
    for t in range(len(x)):
        if hard[t]:
            state = x[t].copy()
        else:
            a = np.where((x[t] - state) * sign > 0, attack_a, alpha)
            state = a * state + (1.0 - a) * x[t]
        out[t] = state
    return out
