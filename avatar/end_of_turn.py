"""End of turn by meaning and prosody (Triton-free): the `turn_detector` model's input, and
the endpointing strategy that asks it at a short pause.

The served model is Smart Turn v3.2 (export/turn_detector/recipe.py): a Whisper-tiny-sized
encoder over the Whisper log-mel of the LAST 8 s of 16-kHz audio (zero-padded in front),
waveform normalised to zero mean and unit variance first, as its authors' feature extractor
(transformers' `WhisperFeatureExtractor(chunk_length=8, do_normalize=True)`) computes it;
it answers the probability that the speaker has finished their turn.

`ModelEndpointer` is one `avatar.endpointing.TurnEndStrategy` among others: at short silences
inside speech it asks the models (`AskTurnModel`: the gateway sends the audio to
`turn_detector` and the transcript at the pause to `turn_words`, avatar/turn_words.py) and
fuses the two answers (`Fusion`): a "complete" answer ends the turn at once, words that are
not finished let the speaker pause longer than the silence rule would ("I would like to ...
extend my stay" is protected).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from avatar.asr.features import log_mel
from avatar.endpointing import AskTurnModel, Endpointer, EndpointEvent, TooShort, Utterance
from avatar.vad import CHUNK_S

SAMPLE_RATE = 16_000
WINDOW_S = 8  # the model hears the last 8 s
WINDOW = WINDOW_S * SAMPLE_RATE
N_MELS = 80
FRAMES = WINDOW // 160  # 800 mel frames
FEATURES_SHAPE = (N_MELS, FRAMES)
_NORM_EPS = 1e-7  # the reference extractor's variance floor


def turn_features(audio: np.ndarray) -> np.ndarray:
    """[80, 800] float32 model input from 16-kHz mono `audio` (any length): its last 8 s,
    zero-padded in front, normalised, then the project's Whisper log-mel
    (avatar/asr/features.py: the same filters, window and scaling as Whisper's)."""
    audio = np.asarray(audio, np.float32).reshape(-1)[-WINDOW:]
    window = np.zeros(WINDOW, np.float32)
    if len(audio):
        window[-len(audio) :] = audio
    # in float32 over the padded window, as the reference normalises its padded buffer
    window = (window - window.mean()) / np.sqrt(window.var() + _NORM_EPS)
    return log_mel(window, N_MELS, padding=0)


def batch_features(utterances: list[np.ndarray]) -> np.ndarray:
    """[n, 80, 800]: the model's batch for several utterances."""
    return (
        np.stack([turn_features(u) for u in utterances])
        if utterances
        else np.zeros((0, *FEATURES_SHAPE), np.float32)
    )


# Words a finished turn does not end on ("Can you tell me where the.", "I would like to."),
# though Whisper may write a period after them. Not prepositions, pronouns or auxiliaries:
# "Where are you from?", "What is it?", "Yes, I do." end on them.
DANGLING = frozenset({
    "a", "an", "the", "and", "or", "but", "because", "my", "your", "our", "their", "its",
    "to", "um", "uh", "er", "hmm", "very",
})  # fmt: skip
_ENDS = (".", "?", "!", "。", "？", "！")
_UNFINISHED = ("...", "…", "-", "—", ",", "，")


def text_complete(text: str) -> bool | None:
    """Whether a transcript reads as a finished turn: False when it trails off ("...",
    "ill-sp-", a comma) or ends on a word that needs more ("where the"), True when it ends
    with a sentence's end mark, None when the words cannot tell (no text; no end mark:
    Whisper writes short lists such as "10 of clubs" without one)."""
    text = text.strip()
    if not text:
        return None
    if text.endswith(_UNFINISHED):
        return False
    words = text.rstrip("".join(_ENDS)).split()
    last = words[-1].strip("\"'()[]").lower() if words else ""
    if last in DANGLING:
        return False
    return True if text.endswith(_ENDS) else None


# Silences at which the models are asked. The first is also where the gateway's pass at
# the pause starts (SessionOptions.speculate_after_s), whose transcript the words read: a
# finished turn ends about one transcript after it (`python -m perf turn-taking`: 0.1 s
# against 0.2 s, docs/performance.md section 25). The second: docs/performance.md 18.
ASK_AT_S = (0.1, 0.6)
COMPLETE_AT = 0.7
INCOMPLETE_SILENCE_S = 1.4  # an unfinished thought may pause this long
UNSURE_SILENCE_S = 1.0  # words Whisper wrote without an end mark
# While an answer is on its way the silence rule waits this long: a transcript that takes
# longer than usual would otherwise let the 0.7-s rule cut a pause the words would have
# held (1 in 3 of the heads cut at 1.5 s before any wait). 1.2 s held on a CPU whose
# transcript p99 was ~0.66 s; on one half as fast the test heads cut at 1.2 / 1.5 s went
# from 9.8 % to 10.7 / 11.5 %, and 1.5 s keeps them at 9.8 % with finished turns as fast
# (`perf turn-taking --answer-wait-s`, docs/performance.md section 25, seventh round)
ANSWER_WAIT_S = 1.5


def logit(p: float, eps: float = 1e-4) -> float:
    """log(p / (1 - p)), `p` clipped to [eps, 1 - eps]."""
    p = min(max(p, eps), 1.0 - eps)
    return math.log(p / (1.0 - p))


END_MARK_RULES = ("mean", "either")  # Fusion.end_mark_rule


@dataclasses.dataclass(frozen=True)
class Fusion:
    """How the audio's and the words' answers combine (chosen on the development split of
    `python -m perf turn-taking`, reported on its test split: docs/performance.md).

    Words below `unfinished_below` hold the turn for `unfinished_silence_s` of silence,
    whatever the audio says (a person who stopped after "can you tell me" goes on);
    otherwise score = words_weight * p(words finished) + (1 - words_weight) * p(audio
    finished) >= complete_at ends the turn now, and below it the silence rule does."""

    words_weight: float = 0.7
    complete_at: float = 0.5
    unfinished_below: float = 0.65
    # a 1.5-s pause after unfinished words is kept; finished words the model doubts wait
    # this long (their p95), so no longer than that needs
    unfinished_silence_s: float = 1.8
    # the audio at or above this: the words' doubt does not hold the turn (the score or the
    # silence rule decides); 1.0: words below `unfinished_below` always hold
    audio_sure_at: float = 1.0
    # the words' answer is turn_words' and Whisper's own (its probability of an end mark
    # after the last word it wrote: it hears how the words were said), averaged in logit
    # space with this weight on Whisper's; 0: turn_words' alone. Off: better on the
    # synthetic voices' heads, but live it held people's card lists ("10 of clubs", which
    # may go on: 0.5) that turn_words lets end (docs/performance.md section 25, sixth round)
    end_mark_weight: float = 0.0
    # how the two are read: "mean", the logit average above; "either", the larger of the
    # two, so that the words hold the turn only where both doubt it (turn_words doubts long
    # read sentences Whisper hears end, Whisper doubts lists turn_words reads as finished)
    end_mark_rule: str = "mean"

    def __post_init__(self) -> None:
        for name in (
            "words_weight",
            "complete_at",
            "unfinished_below",
            "audio_sure_at",
            "end_mark_weight",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        if self.end_mark_rule not in END_MARK_RULES:
            raise ValueError(
                f"end_mark_rule must be one of {END_MARK_RULES}, got {self.end_mark_rule!r}"
            )
        if self.unfinished_silence_s <= 0:
            raise ValueError(f"unfinished_silence_s must be > 0, got {self.unfinished_silence_s}")

    def words(self, words: float | None, end_mark: float | None) -> float | None:
        """The words' probability that the turn is finished: turn_words' (`words`) with
        Whisper's end mark (`end_mark`, avatar.asr.greedy.WindowResult.end_probability)."""
        if words is None or end_mark is None:
            return words
        if self.end_mark_rule == "either":
            return max(words, end_mark)
        if self.end_mark_weight == 0.0:
            return words
        a = self.end_mark_weight
        mixed = (1.0 - a) * logit(words) + a * logit(end_mark)
        return 1.0 / (1.0 + math.exp(-mixed))

    def score(self, audio: float, words: float) -> float:
        return self.words_weight * words + (1.0 - self.words_weight) * audio

    def ended_by(self, audio: float, words: float) -> str:
        """Which evidence carried a complete score: the larger weighted share."""
        return "words" if self.words_weight * words >= (1 - self.words_weight) * audio else "audio"


class ModelEndpointer(Endpointer):
    """Silence endpointing that an end-of-turn model cuts short. Inside speech, at each
    silence of `ask_at_s` it asks (`AskTurnModel`); `decide(p, pause)` with p >=
    `complete_at` ends the turn now. Until the model says "complete", the utterance ends
    after `incomplete_silence_s` of silence once it said "incomplete", or after
    `end_silence_s` (the silence rule); while an answer is on its way, not before
    `answer_wait_s` (an ask that fails answers `decide(None, pause)`: the silence rule).
    Speech that resumes starts over. `pause_s` reports `SpeechPaused` as the silence
    endpointer does (for the speculative transcript)."""

    def __init__(
        self,
        threshold: float = 0.5,
        end_silence_s: float = 0.7,
        min_speech_s: float = 0.25,
        pre_roll_s: float = 0.3,
        max_utterance_s: float = 30.0,
        *,
        pause_s: float | None = None,
        ask_at_s: tuple[float, ...] = ASK_AT_S,
        complete_at: float = COMPLETE_AT,
        incomplete_silence_s: float = INCOMPLETE_SILENCE_S,
        unsure_silence_s: float = UNSURE_SILENCE_S,
        answer_wait_s: float = ANSWER_WAIT_S,
        fusion: Fusion | None = None,
    ):
        if not ask_at_s:
            raise ValueError("ask_at_s: at least one silence to ask the model at")
        if not 0.0 < complete_at < 1.0:
            raise ValueError(f"complete_at must be in (0, 1), got {complete_at}")
        super().__init__(
            threshold, end_silence_s, min_speech_s, pre_roll_s, max_utterance_s, pause_s=pause_s
        )
        self.complete_at = complete_at
        self.ask_at = sorted({max(1, round(s / CHUNK_S)) for s in ask_at_s})
        self.fallback_silence = self.detector.min_silence  # no answer yet: the silence rule
        self.incomplete_silence = max(1, round(incomplete_silence_s / CHUNK_S))
        self.unsure_silence = max(1, round(unsure_silence_s / CHUNK_S))
        self.answer_wait = max(1, round(answer_wait_s / CHUNK_S))
        self.fusion = fusion or Fusion()
        self.unfinished_silence = max(1, round(self.fusion.unfinished_silence_s / CHUNK_S))
        self.pauses = 0  # pauses asked about: an answer names the one it is about
        self._reset()

    @property
    def holding(self) -> bool:
        return self.asking and self.hold > self.fallback_silence

    def set_end_silence(self, seconds: float) -> None:
        super().set_end_silence(seconds)
        self.fallback_silence = self.detector.min_silence
        self._apply()

    def _apply(self) -> None:
        """The silence that ends the turn now: the silence rule's, longer where the answers
        hold the pause, and while one is on its way at least `answer_wait_s` (an answer, not
        the clock, decides)."""
        wait = self.answer_wait if self.outstanding else 0
        self.detector.min_silence = max(self.fallback_silence, self.hold, wait)

    def _reset(self) -> None:
        self.asking = False  # in a pause the model was asked about
        self.outstanding = 0  # asks about this pause not answered yet
        self.hold = 0  # the silence the answers about this pause asked for (0: none)
        self._apply()

    def step(self, chunk: np.ndarray, prob: float) -> list[EndpointEvent]:
        events = super().step(chunk, prob)
        if any(isinstance(e, Utterance | TooShort) for e in events):
            self._reset()  # the silence rule ended it: late answers are about nothing now
        return events

    def _pause_or_resume(self) -> list[EndpointEvent]:
        events = super()._pause_or_resume()
        silent = self.detector.silent
        if silent == 0 and self.asking:  # speech resumed: the silence rule until asked again
            self._reset()
        elif silent in self.ask_at:
            if not self.asking:
                self.asking, self.pauses = True, self.pauses + 1
            self.outstanding += 1
            self._apply()
            events.append(AskTurnModel(np.concatenate(self.chunks), self.pauses))
        return events

    def decide(
        self,
        probability: float | None,
        pause: int,
        text: str | None = None,
        words: float | None = None,
        end_mark: float | None = None,
    ) -> list[EndpointEvent]:
        """The answers about pause number `pause` -> [Utterance] when the turn is complete,
        else [] (an answer about an earlier pause is ignored). `probability`: the audio's
        (turn_detector); `text`: the transcript at that pause (None: speculation off);
        `words`: the words' probability (turn_words, on that transcript; None: no answer);
        `end_mark`: Whisper's probability of an end mark after that transcript's last word
        (read with `words` as `Fusion.words` says; None: not given).
        With both, `Fusion` decides. With a transcript but no words' answer (a server
        without turn_words), the transcript is read by rule: unfinished words ("Can you
        tell me where the") let the speaker pause up to `incomplete_silence_s`, finished
        ones need the audio's "complete", words without an end mark wait
        `unsure_silence_s`. Without a transcript, the audio alone decides. `probability`
        None: the ask failed (no answer will come): the silence rule decides."""
        detector = self.detector
        if pause != self.pauses or not self.asking or detector.start is None:
            return []  # speech resumed (or the turn already ended) since it was asked
        self.outstanding = max(0, self.outstanding - 1)
        events = self._answer(probability, text, self.fusion.words(words, end_mark))
        if self.asking:  # not ended: the silence this answer allows
            self._apply()
        return events

    def _answer(
        self, probability: float | None, text: str | None, words: float | None
    ) -> list[EndpointEvent]:
        if probability is None:
            return []
        if words is not None and text is not None:
            return self._fused(probability, words)
        finished = text_complete(text or "")
        if text is None:  # no transcript (speculation off): the model alone
            finished = probability >= self.complete_at
        if finished is False:
            self.hold = max(self.hold, self.incomplete_silence)
            return []
        if finished is None:  # words without an end mark: a little longer, whatever it says
            self.hold = max(self.hold, self.unsure_silence)
            return []
        if probability < self.complete_at:
            return []  # finished words, doubtful prosody: the silence rule ends it
        return self._end("audio")

    def _fused(self, audio: float, words: float) -> list[EndpointEvent]:
        fusion = self.fusion
        if words < fusion.unfinished_below and audio < fusion.audio_sure_at:
            # unfinished words outvote the audio: Smart Turn hears more silence as more
            # finished, so a later ask in the same pause would otherwise cut them off
            self.hold = max(self.hold, self.unfinished_silence)
            return []
        if fusion.score(audio, words) >= fusion.complete_at:
            return self._end(fusion.ended_by(audio, words))
        return []

    def _end(self, ended_by: str) -> list[EndpointEvent]:
        detector = self.detector
        speech = detector.index - detector.silent - detector.start
        utterance, self.chunks = np.concatenate(self.chunks), []
        self.paused = False
        detector.start, detector.silent = None, 0
        self._reset()
        return [Utterance(utterance, ended_by) if speech >= self.min_speech else TooShort()]
