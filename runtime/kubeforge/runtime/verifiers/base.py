"""The Verifier Protocol: one batched call scores every completion of a group.

Neighbours: every verifier module implements it; ``score.Scorer`` calls it once per group (through ``pool``) with
the completions it has not scored before.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from kubeforge.runtime import types


class Verifier(Protocol):
    """Scores completions of one prompt; returns one float per completion, in order (usually in [0, 1]);
    NaN means "no score for this completion" (the Scorer applies the verifier's fallback)."""

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]: ...
