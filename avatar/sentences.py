"""Sentence boundaries and abbreviations: the one splitter the LLM stream (which
sentence to send to TTS) and TTS (which sentence to synthesise) share.

A sentence ends after `.`, `!`, `?` or `…` (and closing quotes or brackets) followed by
whitespace, or at a line break; not after an abbreviation of `ABBREVIATIONS` or a
single-letter initial ("Dr. Smith", "J. Smith"), and not inside a number ("3.5").
"""

from __future__ import annotations

import html
import re
import unicodedata

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
# Chinese and Japanese end marks need no space after them ("你好。请问...")
_END = re.compile(r"([.!?…]+[\"')\]]*)(\s+)|(\n+)|([。！？]+[”’）」』]*)(\s*)")


def sentence_end(text: str) -> int | None:
    """Where the first complete sentence of `text` ends (after its trailing whitespace),
    or None while no sentence is complete."""
    for match in _END.finditer(text):
        if text[: match.end()].strip() and _is_boundary(text, match):
            return match.end()
    return None


_CLAUSE = re.compile(r"[,;:]\s+|\s[—–-]\s+|[，；：]\s*")


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
    if match.group(3) or match.group(4):  # a line break, a full-width end mark
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


# --------------------------------------------------------------- what of a reply is spoken

_HTML_TAG = re.compile(r"</?[A-Za-z][^<>]{0,200}>")
_IMAGE = re.compile(r"!\[[^\]\n]*\]\([^)\s]*\)")
_LINK = re.compile(r"\[([^\]\n]+)\]\((?:https?://|www\.|/)[^)\s]*\)")
_URL = re.compile(r"\b(?:https?://|www\.)([^\s/?#<>\"']+)[^\s<>\"']*?(?=[.,;:!?)\]]*(?:\s|$))")
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*")
_HEADER = re.compile(r"^[ \t]*#{1,6}[ \t]+", re.MULTILINE)
_BULLET = re.compile(r"^[ \t]*(?:[-*+•·▪►]|\d{1,2}[.)])[ \t]+", re.MULTILINE)
_QUOTE = re.compile(r"^[ \t]*>[ \t]?", re.MULTILINE)
_RULE = re.compile(r"^[ \t]*(?:[-*_][ \t]*){3,}$", re.MULTILINE)
_STRONG = re.compile(r"(\*\*|__|~~)(?=\S)(.+?)(?<=\S)\1")
_CODE = re.compile(r"`([^`\n]*)`")
_STARRED = re.compile(r"\*(?=\S)([^*\n]{1,80}?)(?<=\S)\*")
_UNDERSCORED = re.compile(r"(?<!\w)_(?=\S)([^_\n]{1,80}?)(?<=\S)_(?!\w)")
_BRACKETED = re.compile(r"\[([^\[\]\n]{1,80})\]")
_PARENTHESISED = re.compile(r"\(([^()\n]{1,80})\)")
_EMOTICON = re.compile(
    r"(?<!\S)(?:[:;=8xX][-'^o]?[)(\]\[DPpOo/\\|*3]+|<3+|\^_*\^|[xX]D+)(?=\s|$|[.,!?])"
)
# what LLMs write as stage directions: "(laughs)", "*smiles warmly*", "(with a grin)",
# "(excitedly)"; their first word after an optional "with a"/"in a" starts one of these
_ACTION = re.compile(
    r"^(?:(?:with|in)\s+(?:a|an|the)\s+)?(?:\w+ly\s+)?"
    r"(?:laugh|chuckl|giggl|smil|grin|sigh|paus|wink|nod|shrug|gasp|cough|clears?\s+(?:her|his|my)"
    r"|wav(?:e|es|ing)\b|beam|blush|whisper|cheer|clap|hum(?:s|ming)?\b|sniff|yawn|sob|frown"
    r"|gestur|lean|tilt|bow(?:s|ing)?\b|sip|look|glanc|excited|happ(?:y|ily)\b|cheerful"
    r"|warm(?:ly)?\b|soft(?:ly)?\b|playful|enthusiastic|giddy|music|sound|applause|beat\b"
    r"|(?!(?:really|truly|only|actually|definitely|absolutely|totally|exactly|early|fully"
    r"|highly|likely|simply|nearly|family|friendly|lovely)\b)\w+ly$)",
    re.IGNORECASE,
)


def _direction_or_words(match: re.Match) -> str:
    """A stage direction goes; markup around words ("*really*") leaves the words."""
    inner = match[1].strip()
    return " " if _ACTION.match(inner) else inner


def _aside_or_kept(match: re.Match) -> str:
    """ "(laughs)" goes; a real parenthesis ("(about 5 minutes)") is kept as written."""
    return " " if _ACTION.match(match[1].strip()) else match[0]


def _is_emoji(char: str) -> bool:
    # pictographs, dingbats, arrows-as-emoji (So), skin tones (Sk), joiners and selectors
    if char in "\u200d\ufe0e\ufe0f\u20e3":
        return True
    category = unicodedata.category(char)
    return category in ("So", "Cs", "Co") or (category == "Sk" and ord(char) >= 0x1F3FB)


def spoken_text(text: str) -> str:
    """A reply piece as a person should hear it (and the caption may show it): stage
    directions ("(laughs)", "*smiles*", "[pause]"), emoji, emoticons and markup (markdown
    emphasis, headers, bullets, code, HTML tags, link targets) removed; a URL reduced to
    its host ("https://www.grandhotel.com/spa" -> "grandhotel.com"). Words and
    punctuation are kept; numbers are left to TTS normalisation. "" when nothing is left."""
    text = html.unescape(_HTML_TAG.sub(" ", text))
    text = _IMAGE.sub(" ", text)
    text = _LINK.sub(r"\1", text)
    text = _URL.sub(lambda m: m[1].removeprefix("www."), text)
    text = _FENCE.sub(" ", text)
    text = _RULE.sub(" ", text)
    text = _HEADER.sub("", text)
    text = _QUOTE.sub("", text)
    text = _BULLET.sub("", text)
    text = _STRONG.sub(r"\2", text)
    text = _CODE.sub(r"\1", text)
    text = _STARRED.sub(_direction_or_words, text)
    text = _UNDERSCORED.sub(_direction_or_words, text)
    text = _BRACKETED.sub(" ", text)  # "[pause]", "[Your Name]": never words to read out
    text = _PARENTHESISED.sub(_aside_or_kept, text)
    text = "".join(" " if _is_emoji(c) else c for c in text)
    text = _EMOTICON.sub(" ", text)
    text = text.replace("*", " ").replace("#", " ") if "*" in text or "#" in text else text
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r" +([.,!?;:…])", r"\1", text)  # "Hello (waves) !" -> "Hello!"
    text = re.sub(r"^[\s,;:.]+(?=\w)", "", text)  # "(smiles), sure" -> "sure"
    return text.strip() if any(c.isalnum() for c in text) else ""


def ends_sentence(piece: str) -> bool:
    """Whether a piece of the LLM stream ends a sentence: False for a first clause cut at
    `,` `;` `:` or a dash (SentenceSplitter's first_clause_words), True otherwise."""
    return not re.search(r"(?:[,;:，；：]|\s[—–-])\s*$", piece)
