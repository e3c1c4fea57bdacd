"""Pulling the final answer out of a completion, and normalising answers for comparison (pure functions).

Neighbours: ``exact`` compares ``extract(completion)`` with the normalised reference answer.

Rules, first that applies:
1. the content of the last ``\\boxed{...}``;
2. the rest of the line after the last "answer is" / "answer:" / "answer =" marker;
3. the whole completion.
Then, for a numeric reference (e.g. ``-27``, ``3.5``): the last number in that region, compared by value
(``1,234`` == ``1234``, ``68.0`` == ``68``). For any other reference: the first non-empty line; when the reference is
a single word, its first word (the leading run of letters, digits and characters that occur in the reference, so
``ab<garbage>`` and ``ab.`` answer ``ab``); ``normalise``d (whitespace collapsed, surrounding quotes,
``$`` and trailing ``.,;:!?`` removed, case folded).
"""
from __future__ import annotations

import decimal
import re

_MARKER = re.compile(r"(?i)\banswer\s*(?:is\s*:?|:|=)\s*(.*)")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")
_TRAILING = ".,;:!?"


def boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def region(text: str) -> str:
    """Where the final answer is: boxed content, else after the last answer marker, else everything."""
    b = boxed(text)
    if b is not None:
        return b
    matches = list(_MARKER.finditer(text))
    return matches[-1].group(1) if matches else text


def number(text: str) -> decimal.Decimal | None:
    """The value of a string that is one number (commas allowed), or None."""
    t = text.strip().replace(",", "")
    if not t or _NUMBER.fullmatch(t) is None:
        return None
    try:
        return decimal.Decimal(t)
    except decimal.InvalidOperation:
        return None


def last_number(text: str) -> decimal.Decimal | None:
    """The value of the last number in ``text``, or None."""
    found = _NUMBER.findall(text)
    return number(found[-1]) if found else None


def normalise(text: str) -> str:
    """Whitespace collapsed, quotes/``$`` around and trailing punctuation removed, case folded."""
    t = " ".join(text.split())
    t = t.strip("\"'`$ ").rstrip(_TRAILING).strip("\"'`$ ")
    return t.casefold()


def first_word(line: str, *, allowed: str = "") -> str:
    """The leading run of letters, digits and ``allowed`` characters (after leading whitespace)."""
    t = line.lstrip()
    n = 0
    while n < len(t) and (t[n].isalnum() or t[n] in allowed):
        n += 1
    return t[:n]


def text_answer(completion: str, *, reference: str) -> str:
    """The normalised textual final answer of a completion, shaped like ``reference`` (one word or a line)."""
    lines = [ln for ln in region(completion).splitlines() if ln.strip()]
    first = lines[0].strip() if lines else ""
    if len(reference.split()) <= 1:
        first = first_word(first, allowed="".join(set(reference) - set(" ")))
    return normalise(first)
