"""A knowledge folder, kept embedded and searchable: `KnowledgeBase.recall(question)` gives
the best passages for a user's turn as prompt text, under a token budget.

- Embedded once: each passage's text is embedded the first time it is seen (by the served
  `emotion_encoder`, all-MiniLM-L6-v2, through the `encoder` callable) and kept by its
  text, so a reload embeds only the passages that changed.
- Reloaded when the documents change: at most every `check_s` (at turn time, no thread)
  the files' names, sizes and mtimes are compared with the last load's (a few `stat`
  calls); a change re-splits the documents. A reload that fails (a file half-written, the
  encoder down) keeps the previous index and is retried at the next check.
- The budget counts tokens with `count_tokens`: the LLM's own tokenizer where the caller
  has it, else `estimate_tokens`, which over-counts on purpose (the `avatar` model does not
  know which tokenizer the chosen LLM backend uses).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from avatar.knowledge.index import Hit, PassageIndex
from avatar.knowledge.passages import (
    MAX_PASSAGE_CHARS,
    KnowledgeError,
    Passage,
    document_files,
    load_passages,
)
from avatar.sentences import split_sentences

log = logging.getLogger(__name__)

Encoder = Callable[[Sequence[str]], np.ndarray]  # texts -> embeddings [N, D]
TokenCounter = Callable[[str], int]

# the prompt's lead-in to the passages (docs/knowledge.md has the placements measured)
CONTEXT_HEADER = "Information:"


@dataclasses.dataclass(frozen=True)
class KnowledgeConfig:
    # at most this many in the prompt: SmolLM2-135M answered best from one
    # (python -m perf knowledge, docs/knowledge.md); a larger LLM uses more
    passages: int = 1
    tokens: int = 160  # the passages' share of the prompt, in tokens
    # weaker matches are left out, so small talk gets no passages (all-MiniLM-L6-v2 cosine)
    min_score: float = 0.2
    check_s: float = 2.0  # how often the documents' sizes and mtimes are compared
    max_chars: int = MAX_PASSAGE_CHARS  # a passage's bound (passages.py)
    batch: int = 16  # texts per encoder call: the emotion_encoder's max_batch_size
    # > 0: of each chosen passage, only its sentences most like the question, this many, in
    # their order (a small LLM copies the right figure from less text); 0: whole passages
    focus_sentences: int = 0

    def __post_init__(self) -> None:
        if self.passages < 1 or self.tokens < 1:
            raise ValueError("knowledge passages and tokens must be >= 1")
        if self.batch < 1 or self.check_s < 0:
            raise ValueError("knowledge batch must be >= 1 and check_s >= 0")


@dataclasses.dataclass(frozen=True)
class Recall:
    """The passages chosen for one question and the prompt text that carries them."""

    hits: tuple[Hit, ...] = ()
    context: str = ""  # "" when nothing matched
    tokens: int = 0  # what `context` counts under the budget

    def summary(self) -> dict[str, Any]:
        """For the turn's timings: how many passages, their tokens, the best score."""
        best = round(self.hits[0].score, 3) if self.hits else 0.0
        return {"passages": len(self.hits), "tokens": self.tokens, "best_score": best}


def estimate_tokens(text: str) -> int:
    """An upper estimate of a byte-level BPE tokenizer's count: digits, punctuation and a
    space before either as a token each, a non-ASCII character as up to three (its UTF-8
    bytes), letters two and a half to a token. On the venue of `python -m perf knowledge` SmolLM2's
    tokenizer counts 3.0-4.4 characters per token of prose, this about 2.4, and at least
    as many as SmolLM2 on numbers, prices and passwords (tests/test_knowledge.py)."""
    digits = sum(c.isdigit() for c in text)
    other = sum(not c.isalnum() and not c.isspace() and c.isascii() for c in text)
    wide = sum(not c.isascii() for c in text)
    letters = sum(c.isalpha() and c.isascii() for c in text)
    spaces = sum(a.isspace() and not b.isalpha() for a, b in itertools.pairwise(text))
    return digits + other + 3 * wide + spaces + math.ceil(letters / 2.5)


def format_context(passages: Sequence[Passage]) -> str:
    """The passages as the prompt shows them, after a lead-in, each with its title."""
    if not passages:
        return ""
    return " ".join([CONTEXT_HEADER, *(p.full_text for p in passages)])


def choose(hits: Sequence[Hit], config: KnowledgeConfig, count_tokens: TokenCounter) -> Recall:
    """The best hits above `min_score` that fit the budget together, best first (a passage
    too long for what is left is skipped, a shorter one after it may still fit)."""
    chosen: list[Hit] = []
    for hit in hits:
        if len(chosen) == config.passages:
            break
        if hit.score < config.min_score:
            break  # hits come best first
        if count_tokens(format_context([h.passage for h in [*chosen, hit]])) <= config.tokens:
            chosen.append(hit)
    context = format_context([h.passage for h in chosen])
    return Recall(tuple(chosen), context, count_tokens(context) if context else 0)


def _signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Names, sizes and mtimes of the documents: changes when any is edited, added or
    removed (a `stat` per file, so it is cheap at turn time)."""
    found = []
    for path in document_files(folder):
        stat = path.stat()
        found.append((path.relative_to(folder).as_posix(), stat.st_size, stat.st_mtime_ns))
    return tuple(found)


class KnowledgeBase:
    """The knowledge folder's passages, embedded and indexed; thread-safe."""

    def __init__(
        self,
        folder: str | Path,
        encoder: Encoder,
        config: KnowledgeConfig | None = None,
        *,
        count_tokens: TokenCounter = estimate_tokens,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Checks the folder now (KnowledgeError: not a folder, a file not readable);
        the embedding waits for the first `recall` or `refresh` (the encoder model may
        not be loaded yet when the caller starts)."""
        self.folder = Path(folder)
        self.encoder, self.count_tokens, self.clock = encoder, count_tokens, clock
        self.config = config or KnowledgeConfig()
        load_passages(self.folder, self.config.max_chars)  # fail early on a bad folder
        self.index = PassageIndex([], np.zeros((0, 0), np.float32))
        self.loads = 0  # completed loads (1 after the first)
        self._embedded: dict[str, np.ndarray] = {}  # passage text -> its embedding
        self._sentence_vectors: dict[str, np.ndarray] = {}  # passage text -> its sentences'
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._checked = -math.inf
        self._lock = threading.Lock()

    def refresh(self, force: bool = False) -> bool:
        """Reload the documents if they changed since the last load (checked at most every
        `check_s` unless `force`); True when it reloaded. Raises until a first load
        succeeds; later failures are logged and keep the previous index."""
        if not force and self.clock() - self._checked < self.config.check_s:
            return False
        with self._lock:
            if not force and self.clock() - self._checked < self.config.check_s:
                return False  # another thread just checked
            self._checked = self.clock()
            try:
                signature = _signature(self.folder)
                if signature == self._signature:
                    return False
                self._load(signature)
                return True
            except Exception as error:
                if self._signature is None:
                    raise
                log.warning("knowledge: kept the previous documents; reload failed: %s", error)
                return False

    def _load(self, signature: tuple[tuple[str, int, int], ...]) -> None:
        started = time.perf_counter()
        passages = load_passages(self.folder, self.config.max_chars)
        texts = [p.full_text for p in passages]
        new = list(dict.fromkeys(t for t in texts if t not in self._embedded))
        for at in range(0, len(new), self.config.batch):
            batch = new[at : at + self.config.batch]
            vectors = np.asarray(self.encoder(batch), np.float32)
            if vectors.shape[0] != len(batch):
                raise KnowledgeError(
                    f"the encoder gave {vectors.shape[0]} embeddings for {len(batch)}"
                )
            self._embedded.update(zip(batch, vectors, strict=True))
        self._embedded = {t: self._embedded[t] for t in texts}  # forget removed passages
        kept = {p.text for p in passages}
        self._sentence_vectors = {t: v for t, v in self._sentence_vectors.items() if t in kept}
        matrix = np.stack([self._embedded[t] for t in texts]) if texts else np.zeros((0, 0))
        self.index = PassageIndex(passages, matrix)
        self._signature = signature
        self.loads += 1
        log.info(
            "knowledge: %d passages from %d files of %s (%d embedded now) in %.0f ms",
            len(passages),
            len(signature),
            self.folder,
            len(new),
            (time.perf_counter() - started) * 1000.0,
        )

    def search(self, question: str, k: int | None = None) -> list[Hit]:
        """The `k` (default: `config.passages`) passages nearest to the question."""
        return self._search(question, k)[0]

    def _search(self, question: str, k: int | None) -> tuple[list[Hit], np.ndarray | None]:
        self.refresh()
        index = self.index  # one snapshot: a reload swaps it whole
        if not len(index) or not question.strip():
            return [], None
        query = np.asarray(self.encoder([question]), np.float32)[0]
        return index.search(query, k or self.config.passages), query

    def recall(self, question: str) -> Recall:
        """The passages for this question that fit the budget, as prompt text."""
        # a few more candidates than fit, so a long passage skipped leaves room for others
        hits, query = self._search(question, self.config.passages + 2)
        if self.config.focus_sentences and query is not None:
            hits = [self._focused(hit, query) for hit in hits]
        return choose(hits, self.config, self.count_tokens)

    def _focused(self, hit: Hit, query: np.ndarray) -> Hit:
        """`hit` with its passage cut to its `focus_sentences` sentences nearest the query,
        in reading order (their embeddings made once per passage text, then kept)."""
        sentences = split_sentences(hit.passage.text)
        keep = self.config.focus_sentences
        if len(sentences) <= keep:
            return hit
        vectors = self._sentence_vectors.get(hit.passage.text)
        if vectors is None:
            titled = [f"{hit.passage.title}: {s}" if hit.passage.title else s for s in sentences]
            vectors = np.asarray(self.encoder(titled), np.float32)
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            self._sentence_vectors[hit.passage.text] = vectors
        query = query / max(float(np.linalg.norm(query)), 1e-12)
        best = sorted(np.argsort(-(vectors @ query))[:keep])
        text = " ".join(sentences[i] for i in best)
        return Hit(dataclasses.replace(hit.passage, text=text), hit.score)
