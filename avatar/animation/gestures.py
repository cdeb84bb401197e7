"""Gestures as named events with times, triggered by the words and the emotion of a sentence.

The renderer does not draw arms; clients (or a 3D rig) play the named clip. Times are on
the sentence's clock (s), derived from the phoneme timings of the word that triggers them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from avatar.animation.visemes import PhonemeTiming

# name -> clip length (s)
GESTURE_LIBRARY: dict[str, float] = {"wave": 1.6, "nod": 0.8, "emphasis": 0.6, "shrug": 1.0}
TRIGGER_WORDS: dict[str, frozenset[str]] = {
    "wave": frozenset({"hello", "hi", "hey", "welcome", "goodbye", "bye", "greetings"}),
    "nod": frozenset({"yes", "yeah", "sure", "exactly", "absolutely", "agreed", "right"}),
    "shrug": frozenset({"maybe", "perhaps", "dunno", "unsure", "whatever"}),
}
STRONG_EMOTION = 0.6  # intensity from which a non-neutral emotion triggers "emphasis"


@dataclasses.dataclass(frozen=True)
class Gesture:
    """A named clip from GESTURE_LIBRARY to play from `start` to `end` (s)."""

    name: str
    start: float
    end: float
    trigger: str = ""


def word_starts(phonemes: Sequence[PhonemeTiming]) -> list[float]:
    """Start time (s) of each phoneme word (words are separated by ' ' or punctuation)."""
    starts: list[float] = []
    in_word = False
    for p in phonemes:
        if p.symbol.isspace() or not any(ch.isalpha() for ch in p.symbol):
            if p.symbol.isspace() or p.symbol in ".,;:!?":
                in_word = False
            continue
        if not in_word:
            starts.append(p.start)
            in_word = True
    return starts


def detect_gestures(
    text: str, phonemes: Sequence[PhonemeTiming], emotion: str = "neutral", intensity: float = 0.0
) -> list[Gesture]:
    """Gestures for a sentence: trigger words -> wave / nod / shrug; strong emotion -> emphasis."""
    words = re.findall(r"[a-z']+", text.lower())
    starts = word_starts(phonemes)

    def time_of(index: int) -> float:
        if not starts:
            return 0.0
        if len(starts) == len(words):
            return starts[index]
        return starts[min(len(starts) - 1, round(index * len(starts) / max(len(words), 1)))]

    gestures: list[Gesture] = []
    for name, triggers in TRIGGER_WORDS.items():
        for i, word in enumerate(words):
            if word in triggers:
                start = time_of(i)
                gestures.append(Gesture(name, start, start + GESTURE_LIBRARY[name], word))
                break
    if emotion != "neutral" and intensity >= STRONG_EMOTION and starts:
        # on the first primary-stressed syllable, where speakers put the beat
        stressed = [p.start for p in phonemes if p.symbol == "ˈ"]
        start = stressed[0] if stressed else starts[0]
        gestures.append(Gesture("emphasis", start, start + GESTURE_LIBRARY["emphasis"], emotion))
    return sorted(gestures, key=lambda g: g.start)
