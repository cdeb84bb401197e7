"""Phoneme timings -> viseme segments -> per-frame viseme weights with coarticulation.

Coarticulation follows the dominance model of Cohen & Massaro (1993): each segment pulls
the face towards its viseme with a dominance that is constant inside the segment and
decays exponentially outside it; a frame is the dominance-weighted mean of all segments.
Bilabial closures (p, b, m) and pauses are then enforced as hard constraints so that
blending with neighbours never leaves the lips apart where they must touch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import numpy as np

from avatar.animation import tables
from avatar.errors import RequestError

log = logging.getLogger(__name__)

# Seconds over which a segment's dominance decays outside it (anticipation / carry-over).
DECAY_S: dict[str, float] = {"PP": 0.008, "sil": 0.015}
DEFAULT_DECAY_S = 0.035


@dataclasses.dataclass(frozen=True)
class PhonemeTiming:
    """One phoneme symbol (espeak-ng IPA, as piper_phonemize gives it) and its time span (s)."""

    symbol: str
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class VisemeSegment:
    """A span (s) during which the face aims at one viseme; `symbols` it came from."""

    viseme: str
    start: float
    end: float
    symbols: str = ""

    @property
    def center(self) -> float:
        return 0.5 * (self.start + self.end)


def as_timings(items: Iterable[PhonemeTiming | Sequence]) -> list[PhonemeTiming]:
    """Accept PhonemeTiming objects or (symbol, start, end) tuples; validate them."""
    timings = []
    previous_start = -np.inf
    for i, item in enumerate(items):
        timing = item if isinstance(item, PhonemeTiming) else PhonemeTiming(*item)
        start, end = float(timing.start), float(timing.end)
        if not (np.isfinite(start) and np.isfinite(end)) or end < start or start < 0:
            raise RequestError(
                f"phoneme {i} ({timing.symbol!r}): span [{start}, {end}] is not a valid "
                "time span; expected 0 <= start <= end in seconds"
            )
        if start < previous_start - 1e-6:
            raise RequestError(
                f"phoneme {i} ({timing.symbol!r}) starts at {start} s, before the previous "
                f"one ({previous_start} s); expected phonemes in time order"
            )
        previous_start = start
        timings.append(PhonemeTiming(str(timing.symbol), start, end))
    return timings


def _classify(symbol: str, duration: float, pause_threshold: float) -> str:
    """Viseme name, or a modifier kind from tables.MODIFIERS."""
    if symbol in tables.PHONEME_TO_VISEME:
        return tables.PHONEME_TO_VISEME[symbol]
    if symbol in tables.PUNCTUATION or symbol in tables.UTTERANCE_MARKS:
        return "sil"
    kind = tables.MODIFIERS.get(symbol)
    if kind == "boundary":
        return "sil" if duration >= pause_threshold else "prev"
    if kind is not None:
        return kind
    log.debug("phoneme %r has no viseme; shaped by its neighbour", symbol)
    return "neighbour"


def phonemes_to_segments(
    phonemes: Iterable[PhonemeTiming | Sequence], pause_threshold: float = 0.12
) -> list[VisemeSegment]:
    """Merge phoneme timings into viseme segments covering the utterance without gaps.

    Stress marks join the phoneme after them, length marks the one before; h and ʔ take
    the viseme of the phoneme they precede; punctuation and word gaps of at least
    `pause_threshold` seconds become `sil`. Adjacent equal visemes merge.
    """
    timings = as_timings(phonemes)
    units: list[list] = []  # [kind_or_viseme, start, end, symbols]
    for t in timings:
        units.append([_classify(t.symbol, t.end - t.start, pause_threshold), t.start, t.end,
                      t.symbol])  # fmt: skip
    # "neighbour": take the next real viseme (else sil); "next"/"prev": merge time.
    next_viseme = "sil"
    for unit in reversed(units):
        if unit[0] == "neighbour":
            unit[0] = next_viseme
        elif unit[0] not in ("next", "prev"):
            next_viseme = unit[0]
    merged: list[list] = []
    pending: list | None = None  # "next" units waiting for their phoneme
    for unit in units:
        kind = unit[0]
        if kind == "next":
            pending = unit if pending is None else [kind, pending[1], unit[2], pending[3] + unit[3]]
            continue
        if kind == "prev" and merged:
            merged[-1][2] = max(merged[-1][2], unit[2])
            merged[-1][3] += unit[3]
            continue
        if kind == "prev":  # nothing before it: a short pause
            kind = unit[0] = "sil"
        start, symbols = unit[1], unit[3]
        if pending is not None:
            start, symbols = pending[1], pending[3] + symbols
            pending = None
        if merged and merged[-1][0] == kind:
            merged[-1][2] = unit[2]
            merged[-1][3] += symbols
        else:
            merged.append([kind, start, unit[2], symbols])
    if pending is not None:
        merged.append(["sil", pending[1], pending[2], pending[3]])
    if merged and merged[0][1] > 0 and merged[0][0] != "sil":  # rest before the first sound
        merged.insert(0, ["sil", 0.0, merged[0][1], ""])
    segments = []
    for i, (viseme, start, end, symbols) in enumerate(merged):
        # close gaps: a segment lasts until the next one starts
        until = max(end, merged[i + 1][1]) if i + 1 < len(merged) else end
        segments.append(VisemeSegment(viseme, start, until, symbols))
    return segments


def frame_times(duration: float, fps: float) -> np.ndarray:
    """Times (s) of the frames covering [0, duration]: frame i shows time i / fps. [T]"""
    count = int(np.floor(duration * fps + 1e-9)) + 1
    return np.arange(count, dtype=np.float64) / fps


def viseme_weights(segments: Sequence[VisemeSegment], times: np.ndarray) -> np.ndarray:
    """Dominance-blended viseme weights at `times` [T] -> [T, 15], rows summing to 1."""
    if not segments:
        out = np.zeros((len(times), len(tables.VISEMES)))
        out[:, tables.VISEME_INDEX["sil"]] = 1.0
        return out
    starts = np.array([s.start for s in segments])
    ends = np.array([s.end for s in segments])
    dominance = np.array([tables.DOMINANCE[s.viseme] for s in segments])
    decay = np.array([DECAY_S.get(s.viseme, DEFAULT_DECAY_S) for s in segments])
    t = times[:, None]
    distance = np.maximum(starts[None, :] - t, 0.0) + np.maximum(t - ends[None, :], 0.0)
    # The segment containing t keeps its full dominance; [T, S]
    influence = dominance[None, :] * np.exp(-distance / decay[None, :])
    influence /= influence.sum(axis=1, keepdims=True) + 1e-12
    onehot = np.zeros((len(segments), len(tables.VISEMES)))
    onehot[np.arange(len(segments)), [tables.VISEME_INDEX[s.viseme] for s in segments]] = 1.0
    return influence @ onehot


def closure_mask(
    segments: Sequence[VisemeSegment], times: np.ndarray, pause_lead: float = 0.1
) -> tuple[np.ndarray, np.ndarray]:
    """Frames where the lips must be closed, and the viseme that closes them.

    Returns (mask [T] bool, viseme index [T] int). A p/b/m segment closes every frame inside
    it and, if it is shorter than a frame, the frame nearest its centre; a pause closes its
    frames from `pause_lead` seconds (at most half the pause) after it starts, so that the
    mouth can ease shut.
    """
    mask = np.zeros(len(times), dtype=bool)
    which = np.full(len(times), tables.VISEME_INDEX["sil"], dtype=np.int64)
    if len(times) == 0:
        return mask, which
    step = times[1] - times[0] if len(times) > 1 else 1.0
    for k, s in enumerate(segments):
        last = k == len(segments) - 1
        if s.viseme == "PP":
            inside = (times >= s.start) & (times < s.end)
            inside[int(np.clip(np.rint(s.center / step), 0, len(times) - 1))] = True
        elif s.viseme == "sil":
            lead = min(pause_lead, 0.5 * (s.end - s.start))
            inside = (times >= s.start + lead) & ((times < s.end) | last)
        else:
            continue
        mask |= inside
        which[inside] = tables.VISEME_INDEX[s.viseme]
    return mask, which
