"""Verifiers: score a whole group of completions (one call per verifier per group), then aggregate to rewards.

Modules (design: docs/verifiers.md): ``base`` (the ``Verifier`` Protocol), one file per verifier (``exact``,
``math_equivalence``, ``regex``, ``length``, ``code`` + ``sandbox``, ``python_fn``, ``reward_model``),
``registry`` (VerifierType -> constructor), ``pool`` (concurrent, time-limited calls; process workers), ``score_cache``,
``aggregate`` (WeightedSum, MajorityVote, WeakSupervision), ``weak`` (the label model), ``score`` (``Scorer``).

Neighbours: the verifier role loop receives ``wire.Rollout``, calls ``Scorer.apply`` and sends ``wire.Scored``;
the role's observer records per-verifier scores, errors, fallbacks, accuracies and weights.

Invariants: rewards are finite floats, one per completion; a verifier that raises, overruns its time limit or
returns something invalid gives its completions the configured fallback (counted); scoring never crashes the role.
"""
from __future__ import annotations

from kubeforge.runtime.verifiers.base import Verifier
from kubeforge.runtime.verifiers.registry import REGISTRY, build
from kubeforge.runtime.verifiers.score import Scorer, score_group

__all__ = ["REGISTRY", "Scorer", "Verifier", "build", "score_group"]
