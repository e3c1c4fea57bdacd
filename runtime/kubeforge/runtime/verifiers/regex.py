"""Regex: 1 when the completion matches the pattern (anywhere, or the whole completion with fullMatch), else 0.

Neighbours: ``registry`` builds it for ``type: Regex`` from ``VerifierSpec.regex``; the API model refuses a pattern
that does not compile (naming the field); a pattern the runtime engine refuses fails the build the same way.

Matching runs on the ``regex`` engine with a time limit: the whole group gets ``timeout_s``; a completion whose
match runs out of time (catastrophic backtracking) scores NaN, which the Scorer turns into the verifier's fallback
score and counts. The engine itself matches nested quantifiers like ``^(a+)+$`` without backtracking.
"""
from __future__ import annotations

import math
import time
from typing import Sequence

import regex as regex_engine

from kubeforge.runtime import types

DEFAULT_TIMEOUT_S = 1.0
MIN_SLICE_S = 0.001  # a completion reached after the group's budget is spent still gets this long


class Regex:
    def __init__(self, *, pattern: str, full_match: bool = False, field: str = "regex.pattern",
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        try:
            self._re = regex_engine.compile(pattern)
        except regex_engine.error as e:
            raise ValueError(f"{field}: invalid regular expression {pattern!r}: {e}") from None
        self._match = self._re.fullmatch if full_match else self._re.search
        self.timeout_s = timeout_s
        self.timeouts = 0

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        deadline = time.monotonic() + self.timeout_s
        out: list[float] = []
        for c in completions:
            try:
                hit = self._match(c, timeout=max(deadline - time.monotonic(), MIN_SLICE_S))
            except TimeoutError:
                self.timeouts += 1
                out.append(math.nan)
                continue
            out.append(1.0 if hit is not None else 0.0)
        return out
