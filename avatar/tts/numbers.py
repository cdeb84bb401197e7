"""English number words for text normalisation (cardinals, ordinals, years, decimals).

Words come from `num2words`; its British "and" and thousands commas are dropped for the
US voice ("one hundred five", "twelve thousand three hundred forty-five", years "nineteen
oh five"), which matched the previous hand-written rules on 0-3000, 20 000 random numbers
below 10**15 and every year 1000-9999. Kept here, since num2words does not cover them:
digit-by-digit reading (codes, zero-padded numbers, numbers beyond 10**15) and decimals
read digit by digit after "point".
"""

from __future__ import annotations

from num2words import num2words

_DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
MAX_CARDINAL = 10**15 - 1  # beyond this, digits are read one by one


def _us(words: str) -> str:
    return words.replace(",", "").replace(" and ", " ").replace("oh-", "oh ")


def cardinal(n: int) -> str:
    """12345 -> 'twelve thousand three hundred forty-five'; beyond 10**15, digit by digit."""
    if n < 0:
        return "minus " + cardinal(-n)
    if n > MAX_CARDINAL:
        return digits(str(n))
    return _us(num2words(n))


def ordinal(n: int) -> str:
    """21 -> 'twenty-first'."""
    return _us(num2words(n, to="ordinal"))


def year(n: int) -> str:
    """1984 -> 'nineteen eighty-four', 2005 -> 'two thousand five', 2024 -> 'twenty twenty-four'."""
    return _us(num2words(n, to="year")) if 1000 <= n <= 9999 else cardinal(n)


def digits(text: str) -> str:
    """'0042' -> 'zero zero four two'."""
    return " ".join(_DIGITS[int(c)] for c in text if c.isdigit())


def decimal(integer: str, fraction: str) -> str:
    """('3', '14') -> 'three point one four'."""
    return f"{cardinal(int(integer or '0'))} point {digits(fraction)}"
