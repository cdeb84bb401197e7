"""Answers from the operator's documents: a folder of Markdown or text files, split into
passages (passages.py), embedded by a served model and searched with numpy (index.py),
kept fresh and cut to a token budget per turn (base.py). docs/knowledge.md.

Where the folder comes from: the `avatar` model's `knowledge_dir` parameter, else the
environment variable $AVATAR_KNOWLEDGE_DIR (`avatar serve --knowledge DIR` sets it for
the server it starts); empty: no knowledge.
"""

from __future__ import annotations

from pathlib import Path

from avatar.knowledge.base import (
    Encoder,
    KnowledgeBase,
    KnowledgeConfig,
    Recall,
    estimate_tokens,
    format_context,
)
from avatar.knowledge.index import Hit, PassageIndex
from avatar.knowledge.passages import KnowledgeError, Passage, load_passages, split_document

KNOWLEDGE_DIR_ENV = "AVATAR_KNOWLEDGE_DIR"

__all__ = [
    "KNOWLEDGE_DIR_ENV",
    "Encoder",
    "Hit",
    "KnowledgeBase",
    "KnowledgeConfig",
    "KnowledgeError",
    "Passage",
    "PassageIndex",
    "Recall",
    "check_knowledge_dir",
    "estimate_tokens",
    "format_context",
    "load_passages",
    "split_document",
]


def check_knowledge_dir(folder: str | Path) -> tuple[Path, int]:
    """The folder as an absolute path and its number of passages, for a command line to
    check `--knowledge DIR` before the server starts; KnowledgeError says what is wrong
    (not a folder, no documents, a file that is not UTF-8 text)."""
    path = Path(folder).expanduser().resolve()
    passages = load_passages(path)
    if not passages:
        raise KnowledgeError(f"knowledge folder {path} has no text in .md, .markdown or .txt files")
    return path, len(passages)
