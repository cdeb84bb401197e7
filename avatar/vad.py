"""Voice-activity segmentation over Silero VAD chunk probabilities (Triton-free).

The `vad` model gives one speech probability per 512-sample chunk (32 ms at 16 kHz).
`speech_segments` turns them into segments with hysteresis, as Silero's own
`get_speech_timestamps` does: speech starts above `threshold`, ends after
`min_silence_s` below `threshold - 0.15`, and segments shorter than `min_speech_s`
are dropped.
"""

from __future__ import annotations

import dataclasses

import numpy as np

SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64
STATE_SHAPE = (2, 128)
CHUNK_S = CHUNK / SAMPLE_RATE


@dataclasses.dataclass(frozen=True)
class Segment:
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclasses.dataclass
class VadStream:
    """Per-session recurrent state of the VAD model (the server keeps none)."""

    sessions: int = 1
    state: np.ndarray = dataclasses.field(init=False)
    context: np.ndarray = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.state = np.zeros((self.sessions, *STATE_SHAPE), np.float32)
        self.context = np.zeros((self.sessions, CONTEXT), np.float32)

    def inputs(self, chunk: np.ndarray) -> dict[str, np.ndarray]:
        """Model inputs for `chunk` [sessions, 512]."""
        return {"chunk": chunk, "context": self.context, "state": self.state}

    def update(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        """Keep the returned state; return speech_prob [sessions]."""
        self.state, self.context = outputs["next_state"], outputs["next_context"]
        return outputs["speech_prob"][:, 0]


def chunks(audio: np.ndarray) -> np.ndarray:
    """[n_chunks, 512] float32: the audio zero-padded to whole chunks."""
    audio = np.asarray(audio, np.float32).reshape(-1)
    pad = (-len(audio)) % CHUNK
    return np.pad(audio, (0, pad)).reshape(-1, CHUNK)


def speech_segments(
    probs: np.ndarray,
    threshold: float = 0.5,
    min_silence_s: float = 0.1,
    min_speech_s: float = 0.25,
) -> list[Segment]:
    """Speech segments (seconds) from per-chunk probabilities."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be in (0, 1), got {threshold}")
    off = max(threshold - 0.15, 0.01)
    segments, start, silent = [], None, 0
    min_silence = max(1, round(min_silence_s / CHUNK_S))
    for i, p in enumerate(np.asarray(probs, np.float32)):
        if start is None:
            if p >= threshold:
                start, silent = i, 0
        elif p < off:
            silent += 1
            if silent >= min_silence:
                segments.append((start, i - silent + 1))
                start = None
        else:
            silent = 0
    if start is not None:
        segments.append((start, len(probs)))
    return [
        Segment(a * CHUNK_S, b * CHUNK_S) for a, b in segments if (b - a) * CHUNK_S >= min_speech_s
    ]
