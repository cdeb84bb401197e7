"""Plausible phoneme durations for text, for tests and demos while no TTS timings exist.

Mean durations per phoneme class are typical of read American English (Umeda 1975/1977;
Klatt 1979: vowels ~80-160 ms, consonants ~50-100 ms), jittered with a seeded generator.
Real timings come from the TTS stage (Piper's durations); this module is never used there.
"""

from __future__ import annotations

import numpy as np

from avatar.animation import tables
from avatar.animation.visemes import PhonemeTiming

VOWEL_VISEMES = frozenset({"aa", "E", "ih", "oh", "ou"})
MEAN_DURATION_S: dict[str, float] = {
    "vowel": 0.09,
    "consonant": 0.07,
    "stress": 0.01,
    "length": 0.05,
    "space": 0.02,
    "comma": 0.25,
    "stop": 0.35,
}


def phoneme_class(symbol: str) -> str:
    if symbol in "ˈˌ":
        return "stress"
    if symbol in "ːˑ":
        return "length"
    if symbol == " ":
        return "space"
    if symbol in ",;:—":
        return "comma"
    if symbol in tables.PUNCTUATION:
        return "stop"
    return "vowel" if tables.PHONEME_TO_VISEME.get(symbol) in VOWEL_VISEMES else "consonant"


def synthetic_timings(
    symbols: list[str], seed: int = 0, rate: float = 1.0, lead: float = 0.2
) -> list[PhonemeTiming]:
    """(symbol, start, end) with class-mean durations / `rate`, ±25 % jitter, after `lead` s."""
    rng = np.random.default_rng(seed)
    timings = []
    t = lead
    for symbol in symbols:
        mean = MEAN_DURATION_S[phoneme_class(symbol)] / rate
        duration = mean * rng.uniform(0.75, 1.25)
        timings.append(PhonemeTiming(symbol, t, t + duration))
        t += duration
    return timings


def phonemize(text: str) -> list[str]:
    """espeak-ng en-us IPA symbols of `text`, sentences joined (piper_phonemize)."""
    from piper_phonemize import phonemize_espeak

    return [s for sentence in phonemize_espeak(text, "en-us") for s in sentence]
