"""One sentence's phoneme timings -> visemes, ARKit-52 frames, head pose and gestures.

Order of operations (each a plain function elsewhere in this package):
phonemes -> viseme segments -> dominance-blended viseme weights [T, 15] with hard lip
closures -> ARKit weights [T, 52] -> attack/release EMA (closures pass through) ->
emotion (lip closures kept) -> blinks and gaze -> clip to 0..1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import numpy as np

from avatar.animation import emotion as emo
from avatar.animation import gestures as gest
from avatar.animation import idle, smoothing, tables, visemes
from avatar.errors import RequestError

VISEME_TO_ARKIT_MATRIX = np.zeros((len(tables.VISEMES), len(tables.ARKIT_NAMES)))
for _v, _weights in tables.VISEME_TO_ARKIT.items():
    for _name, _w in _weights.items():
        VISEME_TO_ARKIT_MATRIX[tables.VISEME_INDEX[_v], tables.ARKIT_INDEX[_name]] = _w

SMOOTHING_POLARITY = np.ones(len(tables.ARKIT_NAMES))
SMOOTHING_POLARITY[[tables.ARKIT_INDEX[n] for n in tables.LIP_CLOSING]] = -1.0

EMOTION_RAMP_S = 0.3  # emotion fades in and out over this time at the sentence edges
FPS_RANGE = (1.0, 120.0)


@dataclasses.dataclass(frozen=True)
class AnimationConfig:
    """Controls a client may set per request."""

    fps: float = 30.0
    alpha: float = 0.7  # EMA release: 0.5 responsive ... 0.9 calm
    attack: float = smoothing.DEFAULT_ATTACK
    emotion: str = "neutral"
    intensity: float = 0.0
    seed: int = 0
    t0: float = 0.0  # the sentence's start on the session clock (s), for idle motion
    pause_threshold: float = 0.12  # a word gap at least this long (s) closes the mouth
    blinks: bool = True

    def validate(self) -> AnimationConfig:
        if not FPS_RANGE[0] <= self.fps <= FPS_RANGE[1]:
            raise RequestError(f"fps={self.fps} is out of range; expected {FPS_RANGE} (25/30/60)")
        smoothing.check_alpha(self.alpha)
        smoothing.check_alpha(self.attack, "attack")
        emo.emotion_vector(self.emotion, self.intensity)  # raises on a bad label/intensity
        return self


@dataclasses.dataclass
class Animation:
    """Frames of one sentence at `fps`; frame i shows time `times[i]` (s, sentence clock)."""

    fps: float
    times: np.ndarray  # [T] float64
    visemes: np.ndarray  # [T, 15] float32, rows sum to 1 (tables.VISEMES order)
    blendshapes: np.ndarray  # [T, 52] float32 in 0..1 (tables.ARKIT_NAMES order)
    head_pose: np.ndarray  # [T, 3] float32 yaw, pitch, roll in radians
    closed: np.ndarray  # [T] bool: lips held closed (p, b, m, pauses)
    segments: list[visemes.VisemeSegment]
    gestures: list[gest.Gesture]
    blinks: list[float]  # blink start times (s)

    def viseme_track(self) -> list[tuple[str, float, float]]:
        """(viseme, start, end) per segment, for clients."""
        return [(s.viseme, s.start, s.end) for s in self.segments]


def speech_blendshapes(
    segments: Sequence[visemes.VisemeSegment], times: np.ndarray, config: AnimationConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Visemes [T, 15], smoothed ARKit weights [T, 52] and the closure mask [T]."""
    weights = visemes.viseme_weights(segments, times)
    closed, closer = visemes.closure_mask(segments, times)
    weights[closed] = 0.0
    weights[closed, closer[closed]] = 1.0
    arkit = weights @ VISEME_TO_ARKIT_MATRIX
    arkit = smoothing.ema(arkit, config.alpha, config.attack, closed, SMOOTHING_POLARITY)
    return weights, arkit, closed


def animate(
    phonemes: Iterable[visemes.PhonemeTiming | Sequence],
    config: AnimationConfig | None = None,
    text: str = "",
    duration: float | None = None,
) -> Animation:
    """Animate one sentence from its phoneme timings (s); `duration` defaults to the last end."""
    config = (config or AnimationConfig()).validate()
    timings = visemes.as_timings(phonemes)
    end = max((p.end for p in timings), default=0.0)
    duration = end if duration is None else float(duration)
    if duration < end - 1e-6:
        raise RequestError(f"duration {duration} s is shorter than the phonemes ({end} s)")
    segments = visemes.phonemes_to_segments(timings, config.pause_threshold)
    times = visemes.frame_times(duration, config.fps)
    weights, arkit, closed = speech_blendshapes(segments, times, config)

    ramp = np.clip(np.minimum(times, duration - times) / EMOTION_RAMP_S + 0.5, 0.0, 1.0)
    arkit = emo.blend_emotion(arkit, config.emotion, config.intensity, closed, ramp)

    rng = np.random.default_rng(config.seed)
    blink, blink_starts = idle.blink_curve(times, rng)
    if not config.blinks:
        blink, blink_starts = np.zeros_like(blink), []
    arkit = np.clip(idle.apply_eyes(arkit, blink, idle.gaze(times, rng)), 0.0, 1.0)
    pose = idle.head_pose(times, config.t0, rng)
    return Animation(
        fps=config.fps,
        times=times,
        visemes=weights.astype(np.float32),
        blendshapes=arkit.astype(np.float32),
        head_pose=pose.astype(np.float32),
        closed=closed,
        segments=segments,
        gestures=gest.detect_gestures(text, timings, config.emotion, config.intensity),
        blinks=blink_starts,
    )
