"""DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13): a length-aware reward penalty.

With ``L_max`` the length budget (``spec.algorithm.maxNewTokens``), ``L_cache`` the punishment interval
(``overlongBuffer.length``) and ``p`` its scale (``overlongBuffer.penalty``, the paper's is 1)::

    R_length(y) = 0                                   if |y| <= L_max - L_cache
                = p * ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                = -p                                  if |y| > L_max

and ``R_length`` is added to the verifiers' reward before the group advantages are computed. Generation stops at
``L_max``, so a truncated completion (finish reason ``length``: it would have run past ``L_max``) is the third
case; its value is the second case's at ``|y| = L_max`` (``-p``), so the penalty is continuous and a pure function
of the length. Neighbours: ``learner.batch.rows_of`` calls :func:`shaped_rewards` for every group; dynamic
sampling and ``mean_reward`` see the verifiers' rewards, unshaped (the paper filters on accuracy).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kubeforge.api import rljob
from kubeforge.runtime import types

TRUNCATED = "length"      # vLLM's finish reason when max_tokens stopped the completion


@dataclasses.dataclass(frozen=True, kw_only=True)
class Overlong:
    """The punishment's numbers: ``max_tokens`` = L_max, ``buffer`` = L_cache, ``penalty`` = p."""

    max_tokens: int
    buffer: int
    penalty: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.buffer < self.max_tokens:
            raise ValueError("overlong buffer must be >= 1 and less than max_tokens")
        if self.penalty <= 0:
            raise ValueError("overlong penalty must be > 0")

    @classmethod
    def from_spec(cls, algorithm: rljob.AlgorithmSpec) -> Overlong | None:
        b = algorithm.overlong_buffer
        if b is None:
            return None
        return cls(max_tokens=algorithm.max_new_tokens, buffer=b.length, penalty=b.penalty)

    def length_reward(self, length: int, *, truncated: bool = False) -> float:
        """``R_length`` of a completion of ``length`` tokens (``truncated``: it would have gone on)."""
        if truncated or length > self.max_tokens:
            return -self.penalty
        expected = self.max_tokens - self.buffer
        if length <= expected:
            return 0.0
        return self.penalty * (expected - length) / self.buffer


def truncated(completion: types.Completion) -> bool:
    """Stopped by the length budget: vLLM's finish reason ``length`` (an unknown reason counts as not truncated:
    its length alone then decides, which gives the same penalty at ``|y| = L_max``)."""
    return completion.finish_reason == TRUNCATED


def shaped_rewards(group: types.RolloutGroup, overlong: Overlong | None) -> list[float]:
    """The group's rewards with ``R_length`` added to each (unchanged when ``overlong`` is None)."""
    rewards: Sequence[float] = group.rewards or []
    if overlong is None:
        return [float(r) for r in rewards]
    return [float(r) + overlong.length_reward(len(c.token_ids), truncated=truncated(c))
            for r, c in zip(rewards, group.completions)]
