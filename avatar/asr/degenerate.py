"""Whether a window's transcript is degenerate: Whisper looping instead of transcribing.

Greedy decoding on a short window can fall into a loop: "Can you recommend a . . . . . .",
"a good book book book book", the whole sentence twice. openai/whisper's `transcribe.py`
catches the long loops by the text's zlib compression ratio (> 2.4) and re-decodes at a
higher temperature; short windows never compress that well (zlib's overhead), so the runs
themselves are looked for too: an n-gram of tokens repeated back to back, a stretch of
punctuation with no word in it, a window cut at its token limit (`speech_token_limit`).

`degeneracy` says why a transcript is degenerate (None: it is not); `avatar.asr.transcribe`
re-decodes such a window (`Fallback`) and keeps the first candidate that is not.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Sequence

_NON_WORDS = re.compile(r"[^\w]+")


@dataclasses.dataclass(frozen=True)
class Thresholds:
    # openai/whisper's compression_ratio_threshold: real text of any length stays below it
    compression_ratio: float = 2.4
    # openai/whisper's logprob_threshold; None: not a sign on its own. Off by default:
    # Whisper's loops are confident (-0.39 to -0.61 on the loops of tests/test_asr_degenerate
    # and the first second of the human recordings), while live passes over half a second
    # of speech fall below -1 without looping ("sir in a water", a wrong language): the
    # threshold would re-decode those and miss the loops.
    avg_logprob: float | None = None
    # the most back-to-back repeats of an n-gram of text tokens that real speech shows, by
    # n: "very very very" (3 of one token), "no, no, no" (3 of two), a phrase said twice
    # by a human is rare and Whisper's own loop when it ends a short window
    max_repeats: tuple[tuple[int, int], ...] = ((1, 3), (3, 2), (64, 1))
    # punctuation marks in a row with no word between: "?..." is 4, ". . . . ." is 5
    max_punctuation_run: int = 4


def compression_ratio(text: str) -> float:
    """Bytes of the text over bytes of its zlib stream (openai/whisper's `compression_ratio`):
    a loop compresses well, so its ratio is high."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def longest_repeat(tokens: Sequence[int], max_ngram: int = 64) -> tuple[int, int]:
    """(n, repeats) of the n-gram repeated back to back most often among `tokens` (ties:
    the shortest n); (0, 0) for no tokens. "a b a b a b c": (2, 3)."""
    best = (0, 0)
    seq = list(tokens)
    for n in range(1, min(max_ngram, len(seq)) + 1):
        for start in range(len(seq) - n + 1):
            gram, repeats, at = seq[start : start + n], 1, start + n
            while seq[at : at + n] == gram:
                repeats, at = repeats + 1, at + n
            if repeats > best[1]:
                best = (n, repeats)
    return best


def too_repetitive(tokens: Sequence[int], max_repeats: Sequence[tuple[int, int]]) -> bool:
    """Whether an n-gram of `tokens` repeats back to back more often than `max_repeats`
    allows: (up to n tokens, most repeats) pairs, by increasing n."""
    seq = list(tokens)
    longest = max_repeats[-1][0]
    for n in range(1, min(longest, len(seq) // 2) + 1):
        allowed = next(most for upto, most in max_repeats if n <= upto)
        for start in range(len(seq) - n * (allowed + 1) + 1):
            gram = seq[start : start + n]
            if all(seq[start + k * n : start + (k + 1) * n] == gram for k in range(1, allowed + 1)):
                return True
    return False


def punctuation_run(text: str) -> int:
    """The most punctuation marks in a row with no letter or digit between (spaces skipped):
    Whisper's ". . . . ." loop is a run that no spoken sentence has."""
    return max((len("".join(m.split())) for m in _NON_WORDS.findall(text)), default=0)


def degeneracy(
    text: str,
    text_tokens: Sequence[int],
    avg_logprob: float,
    *,
    hit_limit: bool = False,
    thresholds: Thresholds = Thresholds(),
) -> str | None:
    """Why a window's transcript is degenerate, or None when it is not.

    text: its text; text_tokens: its text tokens (no timestamps or special tokens);
    avg_logprob: its average log-probability per sampled token; hit_limit: decoding stopped
    at the window's token limit, not at end-of-text (Whisper's loops run into it)."""
    if hit_limit:
        return "token limit"  # real speech has at most 7.2 tokens/s; the cap is 10
    ratio = compression_ratio(text)
    if ratio > thresholds.compression_ratio:
        return f"compression ratio {ratio:.2f}"
    if too_repetitive(text_tokens, thresholds.max_repeats):
        n, repeats = longest_repeat(text_tokens)
        return f"{n}-token run repeated {repeats} times"
    run = punctuation_run(text)
    if run > thresholds.max_punctuation_run:
        return f"{run} punctuation marks in a row"
    if thresholds.avg_logprob is not None and avg_logprob < thresholds.avg_logprob:
        return f"average log-probability {avg_logprob:.2f}"
    return None
