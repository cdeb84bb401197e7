"""When the user's turn ends (Triton-free): the endpointing state machine over the `vad`
model's chunk probabilities (avatar/vad.py), chunk by chunk, as pipecat's user-turn stop
strategies decide it. `Endpointer` ends a turn after a silence; in its place another
`TurnEndStrategy` with the same methods, avatar.end_of_turn.ModelEndpointer, asks the
end-of-turn models at short pauses. What each step changed comes back as events
(SpeechStarted, SpeechPaused, ..., Utterance); the live gateway acts on them
(gateway/connection.py)."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from avatar.vad import CHUNK, CHUNK_S, Hysteresis

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

    @property
    def holding(self) -> bool:
        """The answers about this pause let it run longer than the silence rule would (the
        words doubt that the turn is over): what a speculative reply may start on."""

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
        end_mark: float | None = None,
    ) -> list[EndpointEvent]:
        """The end-of-turn models' answers to an `AskTurnModel`: the audio's probability
        (None: the ask failed), the transcript at that pause, the words' probability and
        Whisper's end mark after the transcript, when there are ones -> what they changed."""


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

    @property
    def holding(self) -> bool:
        return False  # silence alone decides: nothing holds a pause

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
        end_mark: float | None = None,
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
