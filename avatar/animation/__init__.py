"""Triton-free animation: phoneme timings -> visemes -> ARKit-52 blendshape frames, with
coarticulation, smoothing, emotion, blinks, idle head motion and gestures.

`animate()` is the entry point; `tables` holds every mapping as data with its source.
"""

from avatar.animation.pipeline import Animation, AnimationConfig, animate
from avatar.animation.visemes import PhonemeTiming, VisemeSegment, phonemes_to_segments

__all__ = [
    "Animation",
    "AnimationConfig",
    "PhonemeTiming",
    "VisemeSegment",
    "animate",
    "phonemes_to_segments",
]
