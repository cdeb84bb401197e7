"""Measures of a decoder's greedy decoding (`avatar.llm.decoder.Decoder`): token agreement
of its continuations with a reference's, perplexity on token rows, and the time of one
decode step. The export verifies its FP32 graph with them against PyTorch
(export/llm/verify.py) and judges its INT8 variant (export/llm/recipe.py's gate)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Sequence

import numpy as np

from avatar.llm.cache import common_prefix
from avatar.llm.decoder import Decoder, greedy, positions


@dataclasses.dataclass
class Agreement:
    """Token agreement of a candidate's greedy continuations with a reference's."""

    prompts: int
    tokens: int
    exact: int  # prompts whose continuation is identical
    first_token: int  # prompts whose first token is identical
    mean_prefix: float  # mean fraction of leading tokens that agree

    @classmethod
    def of(cls, ref: list[list[int]], got: list[list[int]]) -> Agreement:
        prefix = [common_prefix(r, g) / len(r) for r, g in zip(ref, got, strict=True)]
        return cls(
            len(ref),
            len(ref[0]),
            sum(r == g for r, g in zip(ref, got, strict=True)),
            sum(r[0] == g[0] for r, g in zip(ref, got, strict=True)),
            float(np.mean(prefix)),
        )

    @property
    def all_equal(self) -> bool:
        return self.exact == self.prompts


def greedy_rows(decoder: Decoder, prompts: list[list[int]], new: int, batch: int, pad: int):
    """Greedy continuations, `batch` prompts at a time (mixed lengths, left padded)."""
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch):
        out += greedy(decoder, prompts[start : start + batch], new, pad)
    return out


def step_ms(decoder: Decoder, batch: int, past_len: int = 64, steps: int = 12) -> float:
    """Median ms of one decode step (1 new token per row) with a past of `past_len`."""
    layout = decoder.layout
    shape = (batch, layout.kv_heads, past_len, layout.head_dim)
    past = [np.zeros(shape, np.float32) for _ in range(2 * layout.layers)]
    mask = np.ones((batch, past_len + 1), np.int64)
    ids = np.ones((batch, 1), np.int64)
    pos = positions(mask, 1)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        decoder.step(ids, mask, pos, past)
        times.append((time.perf_counter() - started) * 1000)
    return float(np.median(times[2:]))


def perplexity(decoder: Decoder, rows: Sequence[Sequence[int]]) -> float:
    """exp(mean next-token negative log-likelihood) over token rows, each one prefill."""
    total, count = 0.0, 0
    for row in rows:
        ids = np.asarray([row], np.int64)
        mask = np.ones_like(ids)
        logits, _ = decoder.step(ids, mask, positions(mask, ids.shape[1]), decoder.layout.empty(1))
        scores = logits[0, :-1].astype(np.float64)
        scores -= scores.max(axis=-1, keepdims=True)
        scores -= np.log(np.exp(scores).sum(axis=-1, keepdims=True))
        total -= float(scores[np.arange(len(row) - 1), np.asarray(row[1:])].sum())
        count += len(row) - 1
    return float(np.exp(total / count))


def first_sentence(text: str) -> list[str]:
    """The words of a text's first sentence, lower case, without punctuation."""
    head = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return re.sub(r"[^a-z0-9' ]", " ", head.lower()).split()
