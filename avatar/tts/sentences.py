"""Splitting of over-long sentences into clauses and word runs (sentences themselves are
cut by `avatar.sentences.split_sentences`, the splitter the LLM stream uses too)."""

from __future__ import annotations

import re
from collections.abc import Callable

_CLAUSE_RE = re.compile(r"(?<=[,;:])\s+|\s+(?=\()|(?<=\))\s+|\s+-\s+")


def pack(pieces: list[str], cost: Callable[[str], int], limit: int) -> list[str]:
    """Greedily join consecutive pieces (with a space) while their cost stays <= limit.

    A piece that alone exceeds `limit` is returned on its own; the caller splits it further.
    """
    out: list[str] = []
    for piece in pieces:
        if out and cost(out[-1] + " " + piece) <= limit:
            out[-1] = out[-1] + " " + piece
        else:
            out.append(piece)
    return out


def split_long(sentence: str, cost: Callable[[str], int], limit: int) -> list[str]:
    """Split a sentence whose cost exceeds `limit`: at clause punctuation, then between words.

    Nothing is dropped: the pieces joined by spaces give the sentence back.
    """
    if cost(sentence) <= limit:
        return [sentence]
    out: list[str] = []
    for clause in pack(_CLAUSE_RE.split(sentence), cost, limit):
        if cost(clause) <= limit:
            out.append(clause)
        else:
            out.extend(pack(clause.split(), cost, limit))
    return out
