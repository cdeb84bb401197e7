"""Mandarin text for the voices of `zh`: checks, sentences, and espeak-ng's `cmn` notation
rewritten as the IPA the viseme tables read.

espeak-ng writes Mandarin with ASCII habits of its own (what `phonemize_espeak(text,
"cmn")` and its phoneme events give): tones as a digit after the syllable's vowel ("1",
"2", "5"; its "35" comes out as "ɜ"), retroflexes with a dot ("ts.h" = ʈʂʰ, "s." = ʂ,
"i." = the apical vowel after them), "o-" for ɤ and "i̪" for the apical vowel after
dental sibilants. Piper's Chinese voices are trained on exactly these symbols, so the ids
sent to a Piper voice keep them; only the symbols reported with the phoneme timings are
rewritten (`to_ipa`), one for one, so that a tone mark does not read as the English vowel
ɜ and a retroflex dot not as a full stop (which would close the lips).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from avatar.errors import RequestError
from avatar.sentences import spoken_text
from avatar.tts.normalize import MAX_CHARS, CleanText, decode

MAX_SENTENCE_CHARS = 60  # a longer sentence is cut at clause punctuation (~10 s of speech)
# Chinese text after NFKC: the full-width ，！？；：（） are ASCII, 。、… are not
_SENTENCE_END = re.compile(r"[。！？!?…]+[\"'”’)」』]*|\n+")
_CLAUSE_END = re.compile(r"(?<=[,，、;；:：])")
# a stage direction in Chinese: a few Han characters in brackets, "（微笑）", "【笑】"
_DIRECTION = re.compile(r"[(\[【][\u4e00-\u9fff]{1,10}[)\]】]")
_KEEP_PUNCTUATION = set(".,!?;:'\"()-。、…「」『』《》“”‘’")

# espeak-ng cmn tone digits -> Chao tone letters (the first digit espeak keeps)
TONE_LETTERS = {"1": "˩", "2": "˨", "3": "˧", "4": "˦", "5": "˥", "ɜ": "˧"}
RETROFLEX = "\u0323"  # combining dot below: the retroflex mark (espeak's ".")
RETRACTED = "\u0320"  # combining minus below (espeak's "-" in "o-")
_RETROFLEX_OF = {"s": "ʂ", "z": "ʐ"}


def _speakable(char: str) -> bool:
    if char.isalnum() or char in _KEEP_PUNCTUATION or char in " \n":
        return True  # Han characters are letters (Lo), digits are read by espeak in Chinese
    return unicodedata.category(char) == "Mn"


def clean_zh(data: bytes | str, max_chars: int = MAX_CHARS) -> CleanText:
    """Decode and check Chinese text; stage directions, markup and emoji are dropped
    (`avatar.sentences.spoken_text`), other symbols listed in `dropped`."""
    text = decode(data)
    if len(text) > max_chars:
        raise RequestError(
            f"text has {len(text)} characters: expected at most {max_chars} per request; "
            "send a longer text as several requests"
        )
    if not text.strip():
        raise RequestError("text is empty: expected at least one word to speak")
    text = spoken_text(_DIRECTION.sub("", unicodedata.normalize("NFKC", text)))
    kept, dropped = [], []
    for char in text:
        if _speakable(char):
            kept.append(char)
        else:
            dropped.append(char)
            kept.append(" ")
    result = re.sub(r"[ \t]{2,}", " ", "".join(kept)).strip()
    if not any(c.isalnum() for c in result):
        raise RequestError(
            f"text has no speakable characters (dropped: {''.join(dropped)[:20]!r}): "
            "expected at least one Chinese character, letter or digit"
        )
    return CleanText(result, tuple(dropped))


def split_zh(text: str, max_chars: int = MAX_SENTENCE_CHARS) -> list[str]:
    """Sentences of Chinese text (no spaces between them, unlike English); a sentence longer
    than `max_chars` is cut after clause punctuation, then every `max_chars` characters."""
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        sentences.append(text[start : match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    out: list[str] = []
    for sentence in filter(None, sentences):
        if len(sentence) <= max_chars:
            out.append(sentence)
            continue
        piece = ""
        for clause in filter(None, _CLAUSE_END.split(sentence)):
            if piece and len(piece) + len(clause) > max_chars:
                out.append(piece)
                piece = ""
            piece += clause
            while len(piece) > max_chars:  # one clause longer than the limit
                out.append(piece[:max_chars])
                piece = piece[max_chars:]
        if piece.strip():
            out.append(piece)
    return [s.strip() for s in out if any(c.isalnum() for c in s)]


def to_ipa(symbols: Sequence[str], ends_word: bool = True) -> tuple[str, ...]:
    """espeak-ng cmn symbols (one code point each) -> IPA symbols, one for one.

    "ɜ" and digits after a syllable are tones (Chao letters); a "." inside a word marks
    the retroflex (s. -> ʂ, z. -> ʐ, the dot itself a combining mark); "o-" is ɤ. A "."
    that ends a word stays a full stop; with `ends_word` False (one phoneme event, "i.")
    the symbols are inside a word.
    """
    out = list(symbols)
    for k, symbol in enumerate(symbols):
        before = symbols[k - 1] if k else " "
        after = symbols[k + 1] if k + 1 < len(symbols) else (" " if ends_word else "")
        if symbol in TONE_LETTERS and (before.isalpha() or before in "\u032a.-"):
            out[k] = TONE_LETTERS[symbol]
        elif (
            symbol == "." and before.isalpha() and (not after or after.isalnum() or after in "ˈˌɜ")
        ):
            out[k] = RETROFLEX
            out[k - 1] = _RETROFLEX_OF.get(before, before)
        elif symbol == "-" and before == "o" and after != " ":
            out[k - 1], out[k] = "ɤ", RETRACTED
    return tuple(out)
