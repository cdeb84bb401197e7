"""Operator documents -> passages: Markdown (`.md`, `.markdown`) or plain text (`.txt`),
split at headings and blank lines into passages of at most `max_chars` characters.

A passage keeps the headings above it as its title ("Tidewater Spa > Opening hours"):
a paragraph such as "The spa is open from 9:30 am" says what it is about only through
its heading, and both the embedding and the model need that. Short paragraphs of one
section are merged up to the bound (a section is one passage when it fits); a longer
paragraph is split at sentence ends, a longer sentence at a space. The bound keeps each
passage inside the embedding model's window (all-MiniLM-L6-v2 reads 128 word pieces,
`emotion_classifier.MAX_TOKENS`; ~500 characters of English) and lets the prompt's token
budget hold several.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

from avatar.sentences import split_sentences

SUFFIXES = (".md", ".markdown", ".txt")
MAX_PASSAGE_CHARS = 480
MAX_FILE_BYTES = 1_000_000  # an operator's page of facts, not a book: larger files are refused
MAX_FILES = 1000

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_MARKUP = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")  # a list item's bullet


class KnowledgeError(ValueError):
    """A knowledge folder or file that cannot be used; the message names it."""


@dataclasses.dataclass(frozen=True)
class Passage:
    """One retrievable piece of a document."""

    source: str  # the file, relative to the knowledge folder
    title: str  # the headings above it, " > "-joined ("" for none)
    text: str

    @property
    def full_text(self) -> str:
        """What is embedded and what the prompt shows: the title, then the text."""
        return f"{self.title}: {self.text}" if self.title else self.text


def split_document(
    text: str, source: str, *, markdown: bool = True, max_chars: int = MAX_PASSAGE_CHARS
) -> list[Passage]:
    """A document's passages in reading order (empty sections give none)."""
    if max_chars < 40:
        raise ValueError(f"max_chars={max_chars} is too small for a passage (at least 40)")
    passages: list[Passage] = []
    headings: list[tuple[int, str]] = []  # the open headings, (level, text)
    paragraph: list[str] = []
    section: list[str] = []  # the paragraphs of the current section

    def end_paragraph() -> None:
        if paragraph:
            section.append(" ".join(paragraph))
            paragraph.clear()

    def end_section() -> None:
        end_paragraph()
        title = " > ".join(h for _, h in headings)
        passages.extend(Passage(source, title, t) for t in _pack(section, max_chars))
        section.clear()

    lines = text.splitlines() if markdown else _plain_headings(text.splitlines())
    for line in lines:
        heading = _HEADING.match(line)
        if heading and (markdown or line.startswith(_PLAIN_HEADING)):
            end_section()
            level = len(heading.group(1))
            headings = [h for h in headings if h[0] < level] + [
                (level, heading.group(2).lstrip("\ue000"))
            ]
        elif not line.strip():
            end_paragraph()
        elif markdown and _MARKUP.match(line):
            end_paragraph()  # each list item is a paragraph of its own (packed below)
            paragraph.append(_MARKUP.sub("", line).strip())
        else:
            paragraph.append(line.strip())
    end_section()
    return passages


_PLAIN_HEADING = "# \ue000"  # marks a heading found in plain text (no user text has it)


def _plain_headings(lines: list[str]) -> list[str]:
    """Plain text has no heading syntax: a short line on its own, without a full stop,
    between blank lines, with text after it ("Getting around") is taken as one."""
    out = []
    for i, line in enumerate(lines):
        alone = (i == 0 or not lines[i - 1].strip()) and (
            i + 1 < len(lines) and not lines[i + 1].strip()
        )
        alone = alone and any(rest.strip() for rest in lines[i + 1 :])  # text follows it
        short = 0 < len(line.strip()) <= 60 and line.strip()[-1] not in ".!?:;,"
        out.append(f"{_PLAIN_HEADING}{line.strip()}" if alone and short else line)
    return out


def _pack(paragraphs: list[str], max_chars: int) -> Iterator[str]:
    """Paragraphs merged up to `max_chars`, each longer one split at sentence ends."""
    pieces = [piece for p in paragraphs for piece in _bounded(p, max_chars)]
    current = ""
    for piece in pieces:
        if current and len(current) + 1 + len(piece) > max_chars:
            yield current
            current = ""
        current = f"{current} {piece}" if current else piece
    if current:
        yield current


def _bounded(paragraph: str, max_chars: int) -> Iterator[str]:
    if len(paragraph) <= max_chars:
        yield paragraph
        return
    for sentence in split_sentences(paragraph):
        rest = sentence
        while len(rest) > max_chars:  # one very long sentence: cut at a space
            cut = rest.rfind(" ", 0, max_chars + 1)
            cut = cut if cut > 0 else max_chars
            yield rest[:cut].strip()
            rest = rest[cut:].strip()
        if rest:
            yield rest


def document_files(folder: Path) -> list[Path]:
    """The documents under `folder` (recursively, sorted), hidden files skipped."""
    if not folder.is_dir():
        raise KnowledgeError(f"knowledge folder {folder} is not a directory")
    files = sorted(
        p
        for p in folder.rglob("*")
        if p.suffix.lower() in SUFFIXES
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if len(files) > MAX_FILES:
        raise KnowledgeError(f"knowledge folder {folder} has {len(files)} files (max {MAX_FILES})")
    return files


def load_passages(folder: Path, max_chars: int = MAX_PASSAGE_CHARS) -> list[Passage]:
    """Every document's passages; KnowledgeError names a file that cannot be read."""
    passages: list[Passage] = []
    for path in document_files(folder):
        if path.stat().st_size > MAX_FILE_BYTES:
            raise KnowledgeError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise KnowledgeError(f"{path}: cannot read it as UTF-8 text: {error}") from None
        source = path.relative_to(folder).as_posix()
        markdown = path.suffix.lower() != ".txt"
        passages += split_document(text, source, markdown=markdown, max_chars=max_chars)
    return passages
