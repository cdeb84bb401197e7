"""How alike two rendered frames are: the structural similarity the portrait's INT8
candidates are judged by (export/portrait/int8.py)."""

from __future__ import annotations

import numpy as np


def ssim(a: np.ndarray, b: np.ndarray, window: int = 7) -> float:
    """Mean structural similarity of two RGB uint8 frames [S, S, 3], on their luma."""
    from scipy.ndimage import uniform_filter

    weights = np.array([0.299, 0.587, 0.114])
    x, y = (np.asarray(f, np.float64) @ weights for f in (a, b))
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    mx, my = uniform_filter(x, window), uniform_filter(y, window)
    vx = uniform_filter(x * x, window) - mx * mx
    vy = uniform_filter(y * y, window) - my * my
    cov = uniform_filter(x * y, window) - mx * my
    index = ((2 * mx * my + c1) * (2 * cov + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return float(index.mean())
