"""Text checks and normalisation before phonemisation.

`clean()` decides what of the user's text can be spoken (decoding, limits, unsupported
characters) and `normalize()` spells out what espeak-ng would read ambiguously: numbers,
dates, times, money, abbreviations. Punctuation is kept, because the voice turns it into
pauses and intonation.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata

from avatar.errors import RequestError
from avatar.sentences import ABBREVIATIONS, spoken_text
from avatar.tts import numbers

MAX_CHARS = 20_000  # one request; a longer text should be sent as several requests
PUNCTUATION = set(".,!?;:-()'\"")
SYMBOLS = {"$": "dollars", "€": "euros", "£": "pounds", "%": "percent", "#": "number", "/": "slash"}
_TRANSLATE = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u00ab": '"',
        "\u00bb": '"',
        "\u2013": " - ",
        "\u2014": ", ",
        "\u2010": "-",
        "\u2011": "-",
        "\t": " ",
        "\r": "\n",
        "\u2028": "\n",
        "\u2029": "\n",
        "&": " and ",
        "+": " plus ",
        "=": " equals ",
        "@": " at ",
        "[": "(",
        "]": ")",
        "{": "(",
        "}": ")",
    }
)


@dataclasses.dataclass(frozen=True)
class CleanText:
    """Speakable text and what was dropped from the request (for logs and responses)."""

    text: str
    dropped: tuple[str, ...] = ()


def decode(data: bytes | str) -> str:
    """UTF-8 bytes (as a Triton BYTES tensor holds them) -> str, or RequestError."""
    if isinstance(data, str):
        return data
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise RequestError(
            f"text is not valid UTF-8 (byte {data[err.start]:#04x} at offset {err.start}): "
            "expected UTF-8 encoded text"
        ) from None


def _speakable(char: str) -> bool:
    if char.isascii():
        return char.isalnum() or char in PUNCTUATION or char in SYMBOLS or char in " \n"
    if char in SYMBOLS:
        return True
    if unicodedata.category(char).startswith("L"):
        return unicodedata.name(char, "").startswith("LATIN")
    return unicodedata.category(char) == "Mn"  # combining accents of Latin letters


def clean(data: bytes | str, max_chars: int = MAX_CHARS) -> CleanText:
    """Decode and check the request's text; drop what the voice cannot say.

    Emoji, symbols, control characters and non-Latin scripts are dropped (and listed in
    `dropped`); the request fails only when nothing speakable is left or it is too long.
    """
    text = decode(data)
    if len(text) > max_chars:
        raise RequestError(
            f"text has {len(text)} characters: expected at most {max_chars} per request; "
            "send a longer text as several requests"
        )
    if not text.strip():
        raise RequestError("text is empty: expected at least one word to speak")
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE)
    kept: list[str] = []
    dropped: list[str] = []
    for char in unicodedata.normalize("NFC", text):
        if _speakable(char):
            kept.append(char)
        elif char.isspace():
            kept.append(" ")
        else:
            dropped.append(char)
            kept.append(" ")
    result = "".join(kept)
    if not any(c.isalnum() for c in result):
        what = "only punctuation" if result.strip() else "no speakable characters"
        raise RequestError(
            f"text has {what} (dropped: {''.join(dropped)[:20]!r}): "
            "expected at least one letter or digit"
        )
    return CleanText(result, tuple(dropped))


# ------------------------------------------------------------------------ normalisation

# "No." is spoken "number" only before digits, "Co." as written
_ABBREVIATIONS = {k: v for k, v in ABBREVIATIONS.items() if "." not in k and k not in {"no", "co"}}
_ABBREV_RE = re.compile(r"\b(" + "|".join(_ABBREVIATIONS) + r")\.(?=\s|$)", re.IGNORECASE)
_SAINT_RE = re.compile(r"\bSt\.(?=\s+[A-Z])")
_NUMBER_ABBREV_RE = re.compile(r"\bNo\.(?=\s*\d)", re.IGNORECASE)
_LATIN_RE = {  # e.g. i.e. a.m. p.m.
    re.compile(r"\b" + re.escape(k) + r"\.", re.IGNORECASE): v
    for k, v in ABBREVIATIONS.items()
    if "." in k
}
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_ISO_DATE_RE = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_US_DATE_RE = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b")
_MONTH_DAY_RE = re.compile(r"\b(" + "|".join(MONTHS) + r")\s+(\d{1,2})(?:st|nd|rd|th)?\b")
_TIME_RE = re.compile(r"\b(\d{1,2}):(\d{2})(?:\s*([AaPp])\.?[Mm]\.?)?(?=\W|$)")
_HOUR_RE = re.compile(r"\b(\d{1,2})\s*([AaPp])[Mm]\b")
_MONEY_RE = re.compile(r"([$€£])\s?(\d[\d,]*)(?:\.(\d{1,2}))?\b")
# groups joined by "-", "." or spaces, with a "+" or "(area)" or a "-"/"." in them (a list
# of plain numbers is not a phone number), or 10+ digits written together
_PHONE_RE = re.compile(
    r"(?<![\w.,$€£])(?:\+\d{1,3}[ .-]?|\(\d{2,4}\)[ ]?)?\d{2,4}(?:[.-]\d{2,4}){1,4}(?![\w,]|\.\d)"
    r"|(?<![\w.,$€£])(?:\+\d{1,3}|\(\d{2,4}\))[ ]?\d{2,4}(?:[ .-]\d{2,4}){1,4}(?![\w,]|\.\d)"
    r"|(?<![\w.,$€£])\d{10,15}(?![\w,]|\.\d)"
)
_PERCENT_RE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?%")
_ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_DECIMAL_RE = re.compile(r"(?<![\d.])(-?)(\d[\d,]*)\.(\d+)\b")
_INTEGER_RE = re.compile(r"(?<![\w.])(-?)(\d{1,3}(?:,\d{3})+|\d+)\b")
_CURRENCY = {"$": ("dollar", "cent"), "€": ("euro", "cent"), "£": ("pound", "penny")}


def _plural(word: str, count: int) -> str:
    if count == 1:
        return word
    return "pence" if word == "penny" else word + "s"


def _date(year: str, month: str, day: str) -> str:
    m, d = int(month), int(day)
    if not (1 <= m <= 12 and 1 <= d <= 31):
        return f"{year} {month} {day}"  # not a date: read the numbers
    return f"{MONTHS[m - 1]} {numbers.ordinal(d)}, {numbers.year(int(year))}"


def _time(match: re.Match) -> str:
    hour, minute, half = int(match[1]), int(match[2]), match[3]
    if hour > 24 or minute > 59:
        return f"{hour} {minute}"
    # "AM" as one word: espeak-ng reads a lone "A" as the article ("uh em")
    suffix = f" {half.upper()}M" if half else ""
    if minute == 0:
        return f"{numbers.cardinal(hour)}{suffix if half else ' o clock'}"
    spoken = numbers.cardinal(minute) if minute >= 10 else f"oh {numbers.cardinal(minute)}"
    return f"{numbers.cardinal(hour)} {spoken}{suffix}"


def _money(match: re.Match) -> str:
    """ "$12.50" -> "twelve dollars fifty" (as people say prices), "$0.75" -> "seventy-five
    cents", "$3" -> "three dollars"."""
    unit, sub = _CURRENCY[match[1]]
    whole = int(match[2].replace(",", ""))
    cents = int(match[3].ljust(2, "0")) if match[3] else 0
    if not whole and cents:
        return f"{numbers.cardinal(cents)} {_plural(sub, cents)}"
    words = f"{numbers.cardinal(whole)} {_plural(unit, whole)}"
    if cents:
        words += f" {numbers.cardinal(cents) if cents >= 10 else 'oh ' + numbers.cardinal(cents)}"
    return words


def _phone(match: re.Match) -> str:
    """Phone-like digit groups, digit by digit with a pause per group:
    "555-123-4567" -> "five five five, one two three, four five six seven"."""
    digits = sum(c.isdigit() for c in match[0])
    if not 7 <= digits <= 15:
        return match[0]
    groups = re.findall(r"\d+", match[0])
    spoken = ", ".join(numbers.digits(g) for g in groups)
    return ("plus " if match[0].startswith("+") else "") + spoken


def _integer(match: re.Match) -> str:
    sign, text = match[1], match[2]
    value = int(text.replace(",", ""))
    if len(text) > 1 and text.startswith("0"):
        words = numbers.digits(text)  # codes and zero-padded numbers: digit by digit
    elif "," not in text and len(text) == 4 and not sign:
        words = numbers.year(value)
    else:
        words = numbers.cardinal(value)
    return ("minus " if sign else "") + words


def normalize(text: str) -> str:
    """Spell out numbers, dates, times, money, phone numbers and abbreviations; drop
    stage directions and markup (`avatar.sentences.spoken_text`); keep punctuation."""
    text = spoken_text(text)
    for pattern, words in _LATIN_RE.items():
        text = pattern.sub(words, text)
    text = _SAINT_RE.sub("Saint", text)
    text = _NUMBER_ABBREV_RE.sub("number", text)
    text = _ABBREV_RE.sub(lambda m: _ABBREVIATIONS[m[1].lower()], text)
    text = _ISO_DATE_RE.sub(lambda m: _date(m[1], m[2], m[3]), text)
    text = _US_DATE_RE.sub(lambda m: _date(m[3], m[1], m[2]), text)
    text = _MONTH_DAY_RE.sub(lambda m: f"{m[1]} {numbers.ordinal(int(m[2]))}", text)
    text = _PHONE_RE.sub(_phone, text)
    text = _TIME_RE.sub(_time, text)
    text = _HOUR_RE.sub(lambda m: f"{numbers.cardinal(int(m[1]))} {m[2].upper()}M", text)
    text = _MONEY_RE.sub(_money, text)
    text = _PERCENT_RE.sub(lambda m: f"{m[1]} percent", text)
    text = _ORDINAL_RE.sub(lambda m: numbers.ordinal(int(m[1])), text)
    text = _DECIMAL_RE.sub(
        lambda m: ("minus " if m[1] else "") + numbers.decimal(m[2].replace(",", ""), m[3]),
        text,
    )
    text = _INTEGER_RE.sub(_integer, text)
    for symbol, word in SYMBOLS.items():
        text = text.replace(symbol, f" {word} ")
    return re.sub(r"[ ]{2,}", " ", text).strip()
