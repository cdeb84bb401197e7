"""Sampling controls and the next-token choice from logits (numpy, per sequence)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from avatar.errors import RequestError

MAX_NEW_TOKENS = 1024
MAX_SENTENCES = 64
MAX_STOP_STRINGS = 8


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off; repetition_penalty 1 = off."""

    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = 50
    repetition_penalty: float = 1.1
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # the reply ends after this many spoken sentences (a first clause is not one; 0: no
    # limit): the persona's budget, kept by the server rather than asked of the model
    max_sentences: int = 3

    def __post_init__(self) -> None:
        checks = (
            (
                math.isfinite(self.temperature) and 0.0 <= self.temperature <= 5.0,
                f"temperature must be in [0, 5], got {self.temperature}",
            ),
            (
                math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0,
                f"top_p must be in (0, 1], got {self.top_p}",
            ),
            (self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}"),
            (
                math.isfinite(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0,
                f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}",
            ),
            (
                1 <= self.max_tokens <= MAX_NEW_TOKENS,
                f"max_tokens must be in [1, {MAX_NEW_TOKENS}], got {self.max_tokens}",
            ),
            (
                len(self.stop) <= MAX_STOP_STRINGS
                and all(isinstance(s, str) and s for s in self.stop),
                f"stop must be at most {MAX_STOP_STRINGS} non-empty strings",
            ),
            (self.seed is None or 0 <= self.seed < 2**63, f"seed must be >= 0, got {self.seed}"),
            (
                0 <= self.max_sentences <= MAX_SENTENCES,
                f"max_sentences must be in [0, {MAX_SENTENCES}] (0 = no limit), "
                f"got {self.max_sentences}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise RequestError(message)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, defaults: SamplingParams | None = None):
        """Parse a client's sampling object; unknown keys and wrong types are RequestErrors."""
        base = dataclasses.asdict(defaults or cls())
        data = dict(data or {})
        unknown = set(data) - set(base)
        if unknown:
            raise RequestError(f"unknown sampling keys {sorted(unknown)}; known: {sorted(base)}")
        types = {
            "temperature": float,
            "top_p": float,
            "repetition_penalty": float,
            "top_k": int,
            "max_tokens": int,
            "seed": int,
            "max_sentences": int,
        }
        for key, value in data.items():
            if key == "stop":
                stops = [value] if isinstance(value, str) else value
                if not isinstance(stops, list):
                    raise RequestError("stop must be a string or a list of strings")
                base[key] = tuple(stops)
            elif value is None and key == "seed":
                base[key] = None
            elif (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or (types[key] is int and not float(value).is_integer())
            ):
                raise RequestError(f"{key} must be a {types[key].__name__}, got {value!r}")
            else:
                base[key] = types[key](value)
        base["stop"] = tuple(base["stop"])
        return cls(**base)


class LogitBias(Protocol):
    def apply(self, scores: np.ndarray, history: Sequence[int]) -> None: ...


class Sampler:
    """Chooses tokens for one sequence; its own RNG, so a fixed seed repeats the text.
    `bias` (avatar.llm.grounding.CopyBias) changes the scores before the choice."""

    def __init__(self, params: SamplingParams, bias: LogitBias | None = None):
        self.params = params
        self.bias = bias
        self.rng = np.random.default_rng(params.seed)

    def choose(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """logits [V] float32 of the next position; history: prompt + generated ids."""
        p = self.params
        scores = logits.astype(np.float64, copy=True)
        if p.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, np.int64))
            values = scores[seen]
            scores[seen] = np.where(
                values > 0, values / p.repetition_penalty, values * p.repetition_penalty
            )
        if self.bias is not None:
            self.bias.apply(scores, history)
        if p.temperature == 0.0:
            return int(np.argmax(scores))
        scores /= p.temperature
        if 0 < p.top_k < scores.size:
            kth = np.partition(scores, -p.top_k)[-p.top_k]
            scores[scores < kth] = -np.inf
        probs = np.exp(scores - scores.max())
        probs /= probs.sum()
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            keep = cumulative - probs[order] < p.top_p  # always keeps the most likely token
            mask = np.zeros_like(probs, dtype=bool)
            mask[order[keep]] = True
            probs = np.where(mask, probs, 0.0)
            probs /= probs.sum()
        return int(self.rng.choice(probs.size, p=probs))
