"""Sentence boundaries and abbreviations: the one splitter the LLM stream (which
sentence to send to TTS) and TTS (which sentence to synthesise) share.

A sentence ends after `.`, `!`, `?` or `…` (and closing quotes or brackets) followed by
whitespace, or at a line break; not after an abbreviation of `ABBREVIATIONS` or a
single-letter initial ("Dr. Smith", "J. Smith"), and not inside a number ("3.5").
"""

from __future__ import annotations

import re

# abbreviation (lower case, without its final dot) -> how TTS speaks it
ABBREVIATIONS: dict[str, str] = {
    "mr": "Mister",
    "mrs": "Missus",
    "ms": "Miz",
    "dr": "Doctor",
    "prof": "Professor",
    "jr": "Junior",
    "sr": "Senior",
    "mt": "Mount",
    "ave": "Avenue",
    "rd": "Road",
    "vs": "versus",
    "etc": "et cetera",
    "approx": "approximately",
    "inc": "Incorporated",
    "ltd": "Limited",
    "dept": "Department",
    "st": "Street",  # "St." before a capitalised name is Saint (tts.normalize)
    "co": "Company",
    "no": "number",
    "e.g": "for example",
    "i.e": "that is",
    "a.m": "AM",
    "p.m": "PM",
}
_END = re.compile(r"([.!?…]+[\"')\]]*)(\s+)|(\n+)")


def sentence_end(text: str) -> int | None:
    """Where the first complete sentence of `text` ends (after its trailing whitespace),
    or None while no sentence is complete."""
    for match in _END.finditer(text):
        if text[: match.end()].strip() and _is_boundary(text, match):
            return match.end()
    return None


_CLAUSE = re.compile(r"[,;:]\s+|\s[—–-]\s+")


def clause_end(text: str, min_words: int) -> int | None:
    """Index just after the first clause break (`,` `;` `:` or a dash, then whitespace)
    preceded by at least `min_words` words, or None. For starting speech before a long
    first sentence is complete: "Well, the museum opens at nine, ..." -> cut after "nine, "
    with min_words 4. Commas inside numbers ("3,500") have no space after them."""
    for match in _CLAUSE.finditer(text):
        if len(text[: match.start()].split()) >= min_words:
            return match.end()
    return None


def _is_boundary(text: str, match: re.Match) -> bool:
    if match.group(3):  # line break
        return True
    before = text[: match.start()].split()
    word = before[-1].lower().rstrip(".") if before else ""
    return not (match.group(1).startswith(".") and (word in ABBREVIATIONS or len(word) == 1))


def split_sentences(text: str) -> list[str]:
    """'One. Two? Three' -> ['One.', 'Two?', 'Three']; newlines end sentences too."""
    sentences = []
    while (cut := sentence_end(text)) is not None:
        sentences.append(text[:cut].strip())
        text = text[cut:]
    if text.strip():
        sentences.append(text.strip())
    return [s for s in sentences if s]
