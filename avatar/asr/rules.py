"""Whisper's logit rules, batched in numpy (openai/whisper `decoding.py`, as CTranslate2 applies
them for faster-whisper): suppress blank at the first step, suppress non-speech tokens, and the
timestamp rules (pairs, no decrease, initial timestamp <= 1 s, timestamps win when their total
probability beats every text token)."""

from __future__ import annotations

import numpy as np

from avatar.asr.vocab import WhisperVocab


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """[batch, vocab] -> [batch, vocab] log-probabilities (float64, -inf stays -inf)."""
    x = logits.astype(np.float64)
    top = np.max(x, axis=-1, keepdims=True)
    return x - top - np.log(np.sum(np.exp(x - top), axis=-1, keepdims=True))


def apply_rules(
    logits: np.ndarray,
    sampled: list[list[int]],
    vocab: WhisperVocab,
    first_step: bool,
    *,
    timestamps: bool = True,
    max_initial_timestamp_index: int | None = 50,
    max_timestamp_index: int | None = None,
) -> np.ndarray:
    """Mask `logits` [batch, vocab] (a copy) given the tokens sampled so far per row.

    sampled: per row, the tokens sampled after the prompt. first_step: no token sampled yet.
    max_timestamp_index: the window's end (a window shorter than 30 s): no timestamp past it.
    """
    logits = np.array(logits, dtype=np.float32)
    if first_step:
        logits[:, list(vocab.suppress_begin)] = -np.inf
    logits[:, list(vocab.suppress)] = -np.inf
    if not timestamps:
        logits[:, vocab.timestamp_begin :] = -np.inf  # no timestamp tokens without the rules
        return logits
    ts = vocab.timestamp_begin
    logits[:, vocab.no_timestamps] = -np.inf
    if max_timestamp_index is not None:
        # A short window's encoder states past its end are padding: without this, Whisper can
        # walk timestamps on to 30 s, one BLS step each ("How" + 224 stamps up to 23.8 s).
        logits[:, ts + max_timestamp_index + 1 :] = -np.inf
    for k, seq in enumerate(sampled):
        last_ts = len(seq) >= 1 and seq[-1] >= ts
        penultimate_ts = len(seq) < 2 or seq[-2] >= ts
        if last_ts:
            if penultimate_ts:  # a pair just closed: text (or eot) must follow
                logits[k, ts:] = -np.inf
            else:  # an open timestamp: another timestamp or eot, no text
                logits[k, : vocab.eot] = -np.inf
        stamps = [t for t in seq if t >= ts]
        if stamps:  # timestamps never decrease; each segment has non-zero length
            floor = stamps[-1] if last_ts and not penultimate_ts else stamps[-1] + 1
            logits[k, ts:floor] = -np.inf
    if first_step:
        logits[:, :ts] = -np.inf  # begin with a timestamp
        if max_initial_timestamp_index is not None:
            logits[:, ts + max_initial_timestamp_index + 1 :] = -np.inf
    logprobs = log_softmax(logits)
    with np.errstate(divide="ignore"):
        stamp_mass = np.log(np.sum(np.exp(logprobs[:, ts:]), axis=-1))
    text_best = logprobs[:, :ts].max(axis=-1)
    logits[stamp_mass > text_best, :ts] = -np.inf
    return logits
