"""The Verifier Protocol: one batched call scores every completion of a group.

Neighbours: ``exact``, ``math_equivalence``, ``regex`` implement it; ``score.Scorer`` calls it once per group with
the completions it has not scored before.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from kubeforge.runtime import types


class Verifier(Protocol):
    """Scores completions of one prompt; returns one finite float per completion, in order (usually 0 or 1)."""

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]: ...
