"""Regex: 1 when the completion matches the pattern (anywhere, or the whole completion with fullMatch), else 0.

Neighbours: ``registry`` builds it for ``type: Regex`` from ``VerifierSpec.regex``; a pattern that does not compile
is refused at build time with an error naming the field.
"""
from __future__ import annotations

import re
from typing import Sequence

from kubeforge.runtime import types


class Regex:
    def __init__(self, *, pattern: str, full_match: bool = False, field: str = "regex.pattern") -> None:
        try:
            self._re = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"{field}: invalid regular expression {pattern!r}: {e}") from None
        self._match = self._re.fullmatch if full_match else self._re.search

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        return [1.0 if self._match(c) is not None else 0.0 for c in completions]
