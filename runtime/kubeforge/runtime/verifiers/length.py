"""Length: shaping by length. 1 when the stripped completion has between min and max characters, falling linearly
to 0 over ``slope`` characters outside that range.

Neighbours: ``registry`` builds it for ``type: Length`` from ``VerifierSpec.length``.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from kubeforge.runtime import types


@dataclasses.dataclass(frozen=True, kw_only=True)
class Length:
    min_chars: int = 0
    max_chars: int
    slope_chars: int = 1

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        return [self._one(len(c.strip())) for c in completions]

    def _one(self, n: int) -> float:
        off = self.min_chars - n if n < self.min_chars else n - self.max_chars if n > self.max_chars else 0
        return max(0.0, 1.0 - off / self.slope_chars)
