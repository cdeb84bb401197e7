"""Word error rate as users feel it: case, punctuation and digits-vs-words do not count.

Both sides go through the TTS text normaliser (`avatar.tts.normalize`: "10" -> "ten",
"Mr." -> "mister"), are lower-cased and stripped of punctuation; hyphenated words split.
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


def wer(reference: str, hypothesis: str) -> float:
    """One utterance's word error rate."""
    ref = words(reference)
    return edits(ref, words(hypothesis)) / max(1, len(ref))


def corpus_wer(references: Sequence[str], hypotheses: Sequence[str]) -> float:
    """All edits over all reference words (the usual corpus figure: long clips weigh more)."""
    pairs = [(words(r), words(h)) for r, h in zip(references, hypotheses, strict=True)]
    return sum(edits(r, h) for r, h in pairs) / max(1, sum(len(r) for r, _ in pairs))
