"""Passages and their embeddings, searched by cosine similarity with numpy.

An operator's documents are tens to a few thousand passages: an exact search is one
[N, 384] x [384] product (~0.1 ms for 1,000 passages), so no approximate index and no
vector library is needed; the embeddings are L2-normalised once, a dot product is then
the cosine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from avatar.knowledge.passages import Passage


@dataclasses.dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float  # cosine similarity to the question, -1..1


class PassageIndex:
    """An immutable index: swapped whole on reload, so searches need no lock."""

    def __init__(self, passages: Sequence[Passage], embeddings: np.ndarray) -> None:
        embeddings = np.asarray(embeddings, np.float32)
        if len(passages) != (embeddings.shape[0] if embeddings.ndim == 2 else -1):
            raise ValueError(f"{len(passages)} passages, embeddings of shape {embeddings.shape}")
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        self.passages = tuple(passages)
        self.embeddings = embeddings / np.maximum(norms, 1e-12)

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: np.ndarray, k: int) -> list[Hit]:
        """The `k` passages most similar to the query embedding, best first."""
        if not self.passages or k <= 0:
            return []
        query = np.asarray(query, np.float32).reshape(-1)
        if query.shape[0] != self.embeddings.shape[1]:
            raise ValueError(
                f"the query has {query.shape[0]} numbers, the index {self.embeddings.shape[1]}"
            )
        scores = self.embeddings @ (query / max(float(np.linalg.norm(query)), 1e-12))
        k = min(k, len(scores))
        best = np.argpartition(-scores, k - 1)[:k]
        best = best[np.argsort(-scores[best], kind="stable")]
        return [Hit(self.passages[i], float(scores[i])) for i in best]
