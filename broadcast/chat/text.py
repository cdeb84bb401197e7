"""Chat text made safe to queue, caption and speak, and folded for comparing.

`clean` keeps what a viewer meant and drops what a platform or an attacker slips in: IRC
formatting codes (mIRC colours `\\x03NN,MM`, bold, italic, reset...), other control
characters (CR/LF included: a caption is one line), zero-width and bidirectional format
characters (which hide words from a blocklist or reverse a caption). `fold` is the key
duplicates and the blocklist compare: accents removed, case folded, punctuation gone.
"""

from __future__ import annotations

import re
import unicodedata

# mIRC colour: \x03 then up to two digits, optionally "," and up to two more; \x04: hex colour
_IRC_COLOUR = re.compile(
    r"\x03(?:\d{1,2}(?:,\d{1,2})?)?|\x04(?:[0-9a-fA-F]{6}(?:,[0-9a-fA-F]{6})?)?"
)
_WORD = re.compile(r"\w+")
_SPACE = re.compile(r"\s+")


def clean(text: str) -> str:
    """`text` as one line: NFC, IRC formatting and every control (Cc), format (Cf:
    zero-width, bidi overrides), surrogate and private-use character removed, whitespace
    runs made one space, stripped."""
    text = _IRC_COLOUR.sub("", text)
    text = unicodedata.normalize("NFC", text)
    kept = (
        " " if ch in "\t\n\r\x0b\x0c" else ch
        for ch in text
        if ch in "\t\n\r\x0b\x0c" or unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co")
    )
    return _SPACE.sub(" ", "".join(kept)).strip()


def words(text: str) -> list[str]:
    """The words of `text` folded for comparison: accents removed (NFKD, combining marks
    dropped), case folded; punctuation and spacing are not words."""
    decomposed = unicodedata.normalize("NFKD", clean(text).casefold())
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return _WORD.findall(plain)


def fold(text: str) -> str:
    """The comparison key of `text`: its folded words joined by one space."""
    return " ".join(words(text))


def contains_phrase(folded_text: str, folded_phrase: str) -> bool:
    """Whether the folded phrase occurs in the folded text as whole words ("ass" is not in
    "class", "bad word" is in "a bad word here")."""
    return bool(folded_phrase) and f" {folded_phrase} " in f" {folded_text} "


def overlap(a: set[str], b: set[str]) -> float:
    """The Jaccard overlap of two word sets: shared words / all words (0 when both empty)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0
