"""Voice-activity segmentation over Silero VAD chunk probabilities (Triton-free).

The `vad` model gives one speech probability per 512-sample chunk (32 ms at 16 kHz).
`speech_segments` turns them into segments with hysteresis, as Silero's own
`get_speech_timestamps` does: speech starts above `threshold`, ends after
`min_silence_s` below `threshold - 0.15`, and segments shorter than `min_speech_s`
are dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from avatar.model_io import VAD

SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64
STATE_SHAPE = (2, 128)
OUTPUTS = tuple(VAD.outputs)  # speech_prob, next_context, next_state
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
        """Model inputs for `chunk` [sessions, 512] (avatar.model_io.VAD, a row a session)."""
        return VAD.rows(chunk=chunk, context=self.context, state=self.state)

    def update(self, outputs: dict[str, np.ndarray]) -> np.ndarray:
        """Keep the returned state; return speech_prob [sessions]."""
        self.state, self.context = outputs["next_state"], outputs["next_context"]
        return outputs["speech_prob"][:, 0]


def chunks(audio: np.ndarray) -> np.ndarray:
    """[n_chunks, 512] float32: the audio zero-padded to whole chunks."""
    audio = np.asarray(audio, np.float32).reshape(-1)
    pad = (-len(audio)) % CHUNK
    return np.pad(audio, (0, pad)).reshape(-1, CHUNK)


class Hysteresis:
    """Speech on/off from per-chunk probabilities, one chunk at a time: on at `threshold`,
    off after `min_silence_s` below `threshold - 0.15` (Silero's own rule)."""

    def __init__(self, threshold: float = 0.5, min_silence_s: float = 0.1):
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.threshold, self.off = threshold, max(threshold - 0.15, 0.01)
        self.min_silence = max(1, round(min_silence_s / CHUNK_S))
        self.index, self.start, self.silent = 0, None, 0

    def push(self, prob: float) -> tuple[int, int] | None:
        """Feed one chunk's probability; returns (first, end) chunk indices of a segment
        when one has just ended, else None."""
        i, self.index = self.index, self.index + 1
        if self.start is None:
            if prob >= self.threshold:
                self.start, self.silent = i, 0
        elif prob < self.off:
            self.silent += 1
            if self.silent >= self.min_silence:
                segment, self.start = (self.start, i - self.silent + 1), None
                return segment
        else:
            self.silent = 0
        return None

    def flush(self) -> tuple[int, int] | None:
        """The segment still open at the end of the audio, if any."""
        segment = None if self.start is None else (self.start, self.index)
        self.start = None
        return segment


def speech_segments(
    probs: np.ndarray,
    threshold: float = 0.5,
    min_silence_s: float = 0.1,
    min_speech_s: float = 0.25,
) -> list[Segment]:
    """Speech segments (seconds) from per-chunk probabilities."""
    detector = Hysteresis(threshold, min_silence_s)
    found = [detector.push(float(p)) for p in np.asarray(probs, np.float32)]
    segments = [s for s in [*found, detector.flush()] if s is not None]
    return [
        Segment(a * CHUNK_S, b * CHUNK_S) for a, b in segments if (b - a) * CHUNK_S >= min_speech_s
    ]


def speech_probabilities(
    run: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]], audio: np.ndarray
) -> np.ndarray:
    """speech_prob per 512-sample chunk of `audio` [samples] (zero-padded to whole chunks), one
    `run(inputs) -> outputs` call of the `vad` model per chunk, its state carried along."""
    stream, probs = VadStream(), []
    for chunk in chunks(audio):
        probs.append(stream.update(run(stream.inputs(chunk[None]))))
    return np.concatenate(probs) if probs else np.zeros(0, np.float32)


def onnx_vad(session) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
    """`run` for `speech_probabilities` over an onnxruntime session of the `vad` model."""
    return lambda feeds: dict(zip(OUTPUTS, session.run(list(OUTPUTS), feeds), strict=True))
