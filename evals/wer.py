"""Word error rate as users feel it: case, punctuation and digits-vs-words do not count.

Both sides go through the TTS text normaliser (`avatar.tts.normalize`: "10" -> "ten",
"Mr." -> "mister", "5%" -> "five percent"), are lower-cased and stripped of punctuation;
hyphenated words split. The one normalisation of the project: the ASR gate, the TTS
intelligibility gate, perf and the tests all count words with `words`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from avatar.tts.normalize import normalize


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", normalize(text).lower().replace("-", " ")).split()


def edits(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions)."""
    row = list(range(len(hypothesis) + 1))
    for i, r in enumerate(reference, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hypothesis, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, reference word count): the terms of a corpus figure."""
    ref = words(reference)
    return edits(ref, words(hypothesis)), len(ref)


def wer(reference: str, hypothesis: str) -> float:
    """One utterance's word error rate."""
    errors, count = word_errors(reference, hypothesis)
    return errors / max(1, count)


def corpus_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """All edits over all reference words (the usual corpus figure: long clips weigh more)."""
    pairs = [word_errors(r, h) for r, h in zip(references, hypotheses, strict=True)]
    return sum(e for e, _ in pairs) / max(1, sum(n for _, n in pairs))
