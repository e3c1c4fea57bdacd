"""Verifiers: score a whole group of completions against the prompt's reference answer; reward = weighted sum.

Modules: ``base`` (the ``Verifier`` Protocol), one file per verifier (``exact``: ExactAnswer, ``math_equivalence``:
MathEquivalence with math-verify, ``regex``: Regex), ``registry`` (VerifierType -> constructor), ``score``
(``Scorer``/``score_group``: one batched call per verifier per group, a (prompt, response) cache, error counting).

Neighbours: the verifier role loop receives ``wire.Rollout``, calls ``Scorer.score_group`` and sends ``wire.Scored``;
``metrics`` records the per-verifier scores and errors the Scorer reports.

Invariants: scores are finite floats, one per completion; a verifier that raises (or returns something invalid)
scores 0 for that group and is counted in ``Scorer.errors``; scoring never crashes the role.
"""
from __future__ import annotations

from kubeforge.runtime.verifiers.base import Verifier
from kubeforge.runtime.verifiers.registry import REGISTRY, build
from kubeforge.runtime.verifiers.score import Scorer, score_group

__all__ = ["REGISTRY", "Scorer", "Verifier", "build", "score_group"]
