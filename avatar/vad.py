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
from typing import Protocol

import numpy as np

SAMPLE_RATE = 16000
CHUNK = 512
CONTEXT = 64
STATE_SHAPE = (2, 128)
OUTPUTS = ("speech_prob", "next_context", "next_state")
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


END_SILENCE_S = 0.7  # silence that ends an utterance, by default (a live control)


@dataclasses.dataclass(frozen=True)
class SpeechStarted:
    """Speech began (its chunk and the pre-roll before it are kept)."""


@dataclasses.dataclass(frozen=True)
class SpeechPaused:
    """The speaker has been silent for the endpointer's `pause_s` (not yet the end)."""

    audio: np.ndarray  # the utterance so far, pre-roll included


@dataclasses.dataclass(frozen=True)
class SpeechResumed:
    """Speech came back after a pause: that pause was inside the utterance."""


@dataclasses.dataclass(frozen=True)
class Utterance:
    """The end of speech is confirmed."""

    audio: np.ndarray  # [samples]: the pre-roll, the speech and its closing silence
    ended_by: str = "silence"  # or "audio" / "words": the end-of-turn models said complete


@dataclasses.dataclass(frozen=True)
class TooShort:
    """Speech ended too short to be an utterance (a cough, a click)."""


@dataclasses.dataclass(frozen=True)
class AskTurnModel:
    """Ask the end-of-turn model about the utterance so far (`audio`, its trailing silence
    included); its answer goes back to the strategy's `decide(probability, pause)`."""

    audio: np.ndarray
    pause: int  # which pause of the utterance the question is about


EndpointEvent = SpeechStarted | SpeechPaused | SpeechResumed | Utterance | TooShort | AskTurnModel


class TurnEndStrategy(Protocol):
    """When the user's turn ends, decided chunk by chunk from the audio and its speech
    probability, as pipecat's user-turn stop strategies decide it: a silence timeout
    (`Endpointer`), or in its place another detector with the same methods: an end-of-turn
    model over the utterance so far (avatar.end_of_turn.ModelEndpointer, which asks with
    `AskTurnModel` events and hears back through `decide`). The live gateway takes its
    strategy from its options (gateway/endpointing.py)."""

    @property
    def speaking(self) -> bool:
        """In an utterance, and its last chunk was not silent."""

    @property
    def heard_s(self) -> float:
        """Seconds of the utterance so far (pre-roll included); 0 outside one."""

    @property
    def paused(self) -> bool:
        """A pause was reported (SpeechPaused) and speech has not resumed."""

    def audio(self) -> np.ndarray:
        """The utterance so far (pre-roll included); empty outside one."""

    def set_end_silence(self, seconds: float) -> None:
        """Change the silence that ends an utterance (a live control)."""

    def step(self, chunk: np.ndarray, prob: float) -> list[EndpointEvent]:
        """One chunk [512] and its speech probability -> what it changed, in order."""

    def decide(
        self,
        probability: float | None,
        pause: int,
        text: str | None = None,
        words: float | None = None,
    ) -> list[EndpointEvent]:
        """The end-of-turn models' answers to an `AskTurnModel`: the audio's probability
        (None: the ask failed), the transcript at that pause and the words' probability,
        when there are ones -> what they changed."""


class Endpointer:
    """Live end-of-utterance detection (a microphone) by silence: feed 512-sample chunks
    with their speech probabilities; an utterance ends once the speaker has been silent for
    `end_silence_s`, with `pre_roll_s` of audio from before the speech began. `pause_s`:
    a silence of this length inside speech is reported (SpeechPaused) before the end."""

    def __init__(
        self,
        threshold: float = 0.5,
        end_silence_s: float = END_SILENCE_S,
        min_speech_s: float = 0.25,
        pre_roll_s: float = 0.3,
        max_utterance_s: float = 30.0,
        *,
        pause_s: float | None = None,
    ):
        self.detector = Hysteresis(threshold, end_silence_s)
        self.min_speech = max(1, round(min_speech_s / CHUNK_S))
        self.pre_roll = round(pre_roll_s / CHUNK_S)
        self.max_chunks = round(max_utterance_s / CHUNK_S)
        self.pause = None if pause_s is None else max(1, round(pause_s / CHUNK_S))
        self.chunks: list[np.ndarray] = []  # since the pre-roll before the current speech
        self.paused = False

    @property
    def speaking(self) -> bool:
        return self.detector.start is not None and self.detector.silent == 0

    @property
    def heard_s(self) -> float:
        return len(self.chunks) * CHUNK_S if self.detector.start is not None else 0.0

    def audio(self) -> np.ndarray:
        in_speech = self.detector.start is not None
        return np.concatenate(self.chunks) if in_speech else np.zeros(0, np.float32)

    def set_end_silence(self, seconds: float) -> None:
        self.detector.min_silence = max(1, round(seconds / CHUNK_S))

    def decide(
        self,
        probability: float | None,
        pause: int,
        text: str | None = None,
        words: float | None = None,
    ) -> list[EndpointEvent]:
        return []  # silence alone decides: never asks

    def push(self, chunk: np.ndarray, prob: float) -> np.ndarray | None:
        """One chunk [512] and its probability -> the finished utterance, or None."""
        ended = [e for e in self.step(chunk, prob) if isinstance(e, Utterance)]
        return ended[0].audio if ended else None

    def step(self, chunk: np.ndarray, prob: float) -> list[EndpointEvent]:
        self.chunks.append(np.asarray(chunk, np.float32).reshape(CHUNK))
        was_in_speech = self.detector.start is not None
        segment = self.detector.push(prob)
        if self.detector.start is None and segment is None:
            self.chunks = self.chunks[-self.pre_roll :] if self.pre_roll else []
            return []
        if segment is None and len(self.chunks) < self.max_chunks:
            return [SpeechStarted()] if not was_in_speech else self._pause_or_resume()
        if segment is None:  # too long: cut here and start over
            segment = self.detector.flush()
        first, end = segment
        utterance, self.chunks, self.paused = np.concatenate(self.chunks), [], False
        return [Utterance(utterance) if end - first >= self.min_speech else TooShort()]

    def _pause_or_resume(self) -> list[EndpointEvent]:
        silent = self.detector.silent
        if silent == 0 and self.paused:
            self.paused = False
            return [SpeechResumed()]
        if silent == self.pause and not self.paused:
            self.paused = True
            return [SpeechPaused(np.concatenate(self.chunks))]
        return []
