"""What a turn emits, in order: a transcript, one event per reply sentence (or part of a
long sentence), each followed by its rendered frames when the caller asked for video, and a
final summary. A sentence goes out as soon as its audio and blendshapes exist: pixels never
hold the voice. Times are seconds on the turn clock: 0 is the start
of the reply's first audio sample; sentence k starts where sentence k-1's audio ended."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass
class TranscriptEvent:
    text: str


@dataclasses.dataclass
class SentenceEvent:
    index: int
    text: str
    emotion: str
    start: float  # audio and frames of this sentence start here (turn clock, s)
    audio: np.ndarray  # [N] float32, padded to a whole number of frames; empty on error
    sample_rate: int
    fps: float
    blendshapes: np.ndarray  # [T, 52] float32; frame i shows time start + i / fps
    head_pose: np.ndarray  # [T, 3] float32
    animation: dict[str, Any]  # visemes, gestures, blinks (sentence clock, s)
    error: str = ""  # "" or why this sentence has no audio/animation (text still valid)

    @property
    def duration(self) -> float:
        return self.audio.size / self.sample_rate if self.sample_rate else 0.0


@dataclasses.dataclass
class FramesEvent:
    """The rendered frames of sentence `index`, sent after it: frame i shows start + i / fps
    (None where the caller did not ask for the video output)."""

    index: int
    start: float
    fps: float
    frames: np.ndarray | None = None  # [T, H, W, 3] uint8


@dataclasses.dataclass
class FinalEvent:
    transcript: str
    reply: str  # what the avatar actually said (sentences emitted before any stop)
    cancelled: str  # "" | "client" | "superseded"
    errors: list[str]
    timings: dict[str, Any]
    session_id: str = ""  # the session's token: what the next turns send ("": no memory)

    def summary(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


TurnEvent = TranscriptEvent | SentenceEvent | FramesEvent | FinalEvent
