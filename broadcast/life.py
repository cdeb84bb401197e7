"""The anchor's life on the stream's clock: blinks, breathing, gaze and small head motion for
any tick, and the blend between that life and a spoken answer, so that no frame jumps and no
two frames are alike.

The pieces are avatar.animation.idle's (the same blinks, saccades and head sway an answer's
sentences carry); this module evaluates them on the broadcast's tick clock, which never
restarts, in windows drawn once each from a generator seeded by the window's index, so any
tick can be drawn again and a window's edges join.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from avatar.animation import idle
from avatar.animation.tables import ARKIT_INDEX

WINDOW_S = 8.0  # blinks and saccades are drawn per window of this length
BREATH_HZ = 0.22  # about 13 breaths a minute at rest
BREATH_PITCH_RAD = np.radians(0.8)  # the head rises a little with each breath
SMILE = ("mouthSmileLeft", "mouthSmileRight", "cheekSquintLeft", "cheekSquintRight")


@dataclasses.dataclass
class Pose:
    """Frames' ARKit-52 weights [T, 52] and head pose (yaw, pitch, roll) [T, 3]."""

    blendshapes: np.ndarray
    head_pose: np.ndarray

    def __len__(self) -> int:
        return len(self.blendshapes)


class Life:
    """Idle animation for the ticks of one broadcast at `fps` (tick n shows n / fps s)."""

    def __init__(self, fps: float, seed: int = 0) -> None:
        self.fps, self.seed = float(fps), seed
        self._window_ticks = max(1, round(WINDOW_S * self.fps))
        self._windows: dict[int, Pose] = {}

    def _window(self, index: int) -> Pose:
        cached = self._windows.get(index)
        if cached is None:
            start = index * self._window_ticks
            times = (start + np.arange(self._window_ticks)) / self.fps
            rng = np.random.default_rng([self.seed, index])
            blink, _ = idle.blink_curve(times, rng)
            shapes = idle.apply_eyes(np.zeros((len(times), 52)), blink, idle.gaze(times, rng))
            # head sway: fixed phases (one generator for the whole broadcast), so it is one
            # continuous curve across windows
            pose = idle.head_pose(times, 0.0, np.random.default_rng(self.seed))
            pose[:, 1] += BREATH_PITCH_RAD * np.sin(2 * np.pi * BREATH_HZ * times)
            cached = Pose(np.clip(shapes, 0, 1).astype(np.float32), pose.astype(np.float32))
            self._windows = {i: p for i, p in self._windows.items() if i >= index - 1}
            self._windows[index] = cached
        return cached

    def frames(self, first_tick: int, count: int) -> Pose:
        """The idle pose of ticks first_tick .. first_tick + count - 1."""
        ticks = np.arange(first_tick, first_tick + count)
        shapes, poses = np.zeros((count, 52), np.float32), np.zeros((count, 3), np.float32)
        for index in np.unique(ticks // self._window_ticks):
            window = self._window(int(index))
            inside = ticks // self._window_ticks == index
            offsets = ticks[inside] - index * self._window_ticks
            shapes[inside], poses[inside] = window.blendshapes[offsets], window.head_pose[offsets]
        return Pose(shapes, poses)


def with_smile(pose: Pose, strength: float) -> Pose:
    """`pose` smiling (the welcome of a viewer's question): the smile's shapes raised to at
    least `strength`, eased in over the first few frames."""
    shapes = pose.blendshapes.copy()
    ease = np.clip(np.arange(len(pose)) / 6.0, 0.0, 1.0) * strength
    for name in SMILE:
        column = ARKIT_INDEX[name]
        shapes[:, column] = np.maximum(shapes[:, column], ease * (0.5 if "cheek" in name else 1))
    return Pose(shapes, pose.head_pose)


class Blend:
    """How much of the frames is speech (0: idle life, 1: the answer's face), eased over
    `ramp_s` both ways so that the mouth and head never jump between the two."""

    def __init__(self, fps: float, ramp_s: float = 0.2) -> None:
        self.step = 1.0 / max(1.0, ramp_s * fps)
        self.weight = 0.0
        self._last = np.zeros(52, np.float32)  # the last speech frame, which frames ease from

    def mix(self, life: Pose, speech: np.ndarray, speaking: np.ndarray) -> Pose:
        """`life`'s frames with the answer's weights `speech` [T, 52] blended in where
        `speaking` [T] (its other rows are ignored)."""
        weights = np.empty(len(life), np.float32)
        target = np.empty_like(life.blendshapes)
        for i, on in enumerate(speaking):
            if on:
                self._last = speech[i]
            step = self.step if on else -self.step
            self.weight = min(1.0, max(0.0, self.weight + step))
            weights[i], target[i] = self.weight, self._last
        shapes = (1 - weights[:, None]) * life.blendshapes + weights[:, None] * target
        # the head holds nearly still towards the audience while it speaks, sways as it waits
        head = life.head_pose * (1 - 0.6 * weights[:, None])
        return Pose(np.clip(shapes, 0, 1).astype(np.float32), head.astype(np.float32))
