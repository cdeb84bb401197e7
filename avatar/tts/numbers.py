"""English number words for text normalisation (cardinals, ordinals, years, decimals)."""

from __future__ import annotations

_ONES = [
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
MAX_CARDINAL = 10**15 - 1  # beyond this, digits are read one by one


def _below_thousand(n: int) -> list[str]:
    words: list[str] = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(_TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else ""))
    elif n or not words:
        words.append(_ONES[n])
    return words


def cardinal(n: int) -> str:
    """12345 -> 'twelve thousand three hundred forty-five'; beyond 10**15, digit by digit."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n > MAX_CARDINAL:
        return digits(str(n))
    if n < 1000:
        return " ".join(_below_thousand(n))
    words: list[str] = []
    for value, name in _SCALES:
        if n >= value:
            words += [*_below_thousand(n // value), name]
            n %= value
    if n:
        words += _below_thousand(n)
    return " ".join(words)


def ordinal(n: int) -> str:
    """21 -> 'twenty-first'."""
    words = cardinal(n)
    head, sep, last = words.rpartition(" ")
    tens, dash, unit = last.rpartition("-")
    if unit in _ORDINAL_IRREGULAR:
        unit = _ORDINAL_IRREGULAR[unit]
    elif unit.endswith("y"):
        unit = unit[:-1] + "ieth"
    else:
        unit += "th"
    return head + sep + tens + dash + unit


def year(n: int) -> str:
    """1984 -> 'nineteen eighty-four', 2005 -> 'two thousand five', 2024 -> 'twenty twenty-four'."""
    if 1000 <= n <= 9999 and not (2000 <= n <= 2009) and n % 1000 >= 10:
        high, low = divmod(n, 100)
        if low == 0:
            return f"{cardinal(high)} hundred"
        return f"{cardinal(high)} {'oh ' if low < 10 else ''}{cardinal(low)}"
    return cardinal(n)


def digits(text: str) -> str:
    """'0042' -> 'zero zero four two'."""
    return " ".join(_ONES[int(c)] for c in text if c.isdigit())


def decimal(integer: str, fraction: str) -> str:
    """('3', '14') -> 'three point one four'."""
    return f"{cardinal(int(integer or '0'))} point {digits(fraction)}"
