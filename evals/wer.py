"""Word error rate as users feel it: case, punctuation and digits-vs-words do not count.

Both sides go through the TTS text normaliser (`avatar.tts.normalize`: "10" -> "ten",
"Mr." -> "mister", "5%" -> "five percent"), are lower-cased and stripped of punctuation;
hyphenated words split. The one normalisation of the project: the ASR gate, the TTS
intelligibility gate, perf and the tests all count words with `words`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from avatar.tts.normalize import normalize


def words(text: str) -> list[str]:
    return re.sub(r"[^\w\s']", " ", normalize(text).lower().replace("-", " ")).split()


def _rows(reference: Sequence[str], hypothesis: Sequence[str]) -> Iterator[list[int]]:
    """Levenshtein over words, one reference word at a time: row i (from 0) holds the edits
    between reference[:i] and each hypothesis[:j]."""
    row = list(range(len(hypothesis) + 1))
    yield row
    for i, r in enumerate(reference, 1):
        prev, row = row, [i]
        for j, h in enumerate(hypothesis, 1):
            row.append(min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (r != h)))
        yield row


def edits(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    """Levenshtein distance over words (substitutions, insertions, deletions)."""
    *_, last = _rows(reference, hypothesis)
    return last[-1]


def prefix_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) against the start of `reference` that `hypothesis` is
    closest to (the longest such start on a tie): a pass over the first seconds of speech."""
    ref, hyp = words(reference), words(hypothesis)
    best = min((row[-1], -i) for i, row in enumerate(_rows(ref, hyp)))
    return best[0], -best[1]


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
