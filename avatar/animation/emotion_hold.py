"""Emotion hysteresis: the face keeps its emotion across sentences (and turns) unless the
classifier is clearly confident of another one, so it does not flicker.

The classifier labels every sentence on its own, and ordinary small talk gives it many
near-ties ("Have a safe trip!" reads afraid, "fresh towels" disgusted); drawn sentence by
sentence the face changed on almost every sentence. A `Mood` is what the face shows: a
label and a level (0..1, the confidence it was entered with). Each sentence's
(label, confidence) from the classifier moves it by `HoldConfig`:

- the same emotional label refreshes the level (the larger of the two);
- another emotional label replaces it only when its confidence is at least `switch`
  (and at least `enter` when the face is neutral): a strongly emotional sentence still
  gets its label at once;
- anything else (neutral, or a weak other label) lets the held emotion fade: the level is
  multiplied by `decay`, and below `release` the face returns to neutral.

The state is two values per conversation: the turn runner keeps a `Moods` map keyed by
session id (bounded), so a turn starts from the mood the previous one ended with.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

NEUTRAL = "neutral"


@dataclasses.dataclass(frozen=True)
class HoldConfig:
    """Thresholds on the classifier's confidence (its `intensity`, 0..1: 0 at chance, 1 at
    certainty). Chosen on the small-talk set of training/emotion/flicker.py and checked on
    the held-out emotion sentences (docs/performance.md gives the figures)."""

    enter: float = 0.3  # neutral face -> an emotion (0.3 keeps every held-out label)
    switch: float = 0.9  # one emotion -> another ("clearly confident")
    decay: float = 0.7  # per sentence that does not support the held emotion
    release: float = 0.3  # a faded emotion below this level returns to neutral

    def __post_init__(self) -> None:
        for name in ("enter", "switch", "decay", "release"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"HoldConfig.{name}={value}: expected 0..1")


DEFAULT_HOLD = HoldConfig()


@dataclasses.dataclass(frozen=True)
class Mood:
    """What the face shows: a label of `tables.EMOTIONS` and its level 0..1."""

    label: str = NEUTRAL
    level: float = 0.0


def hold(mood: Mood, label: str, confidence: float, config: HoldConfig = DEFAULT_HOLD) -> Mood:
    """The mood after a sentence the classifier read as `label` with `confidence`."""
    confidence = min(max(float(confidence), 0.0), 1.0)
    if label != NEUTRAL:
        if label == mood.label:
            return Mood(label, max(mood.level, confidence))
        needed = config.enter if mood.label == NEUTRAL else config.switch
        if confidence >= needed:
            return Mood(label, confidence)
    if mood.label == NEUTRAL:
        return mood
    level = mood.level * config.decay
    return Mood(mood.label, level) if level >= config.release else Mood()


def held_labels(
    readings: Iterable[tuple[str, float]], mood: Mood = Mood(), config: HoldConfig = DEFAULT_HOLD
) -> list[Mood]:
    """The mood shown on each sentence of a sequence of classifier readings."""
    shown = []
    for label, confidence in readings:
        mood = hold(mood, label, confidence, config)
        shown.append(mood)
    return shown


def changes_per_sentence(labels: Sequence[str]) -> float:
    """Label changes between consecutive sentences, divided by the number of sentences."""
    if not labels:
        return 0.0
    changes = sum(a != b for a, b in itertools.pairwise(labels))
    return changes / len(labels)


class Moods:
    """session id -> the mood its last sentence showed; least recently used dropped past
    `capacity`. Thread-safe (turns of different sessions run on their own threads)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._moods: OrderedDict[str, Mood] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Mood:
        if not session_id:
            return Mood()
        with self._lock:
            mood = self._moods.get(session_id, Mood())
            if session_id in self._moods:
                self._moods.move_to_end(session_id)
            return mood

    def put(self, session_id: str, mood: Mood) -> None:
        if not session_id:
            return
        with self._lock:
            self._moods[session_id] = mood
            self._moods.move_to_end(session_id)
            while len(self._moods) > self.capacity:
                self._moods.popitem(last=False)
