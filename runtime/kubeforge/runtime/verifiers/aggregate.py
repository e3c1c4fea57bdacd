"""Aggregations (``spec.reward.aggregation``): verifier scores of one group -> one reward per completion.

Neighbours: ``score.Scorer`` builds one with ``build(reward spec, verifier specs)`` and calls ``rewards`` per group
with a ``[completions, verifiers]`` array (NaN = the verifier abstained / has no score); ``state`` feeds the
per-verifier accuracy and weight metrics; ``weak.LabelModel`` is the label model of WeakSupervision.

- WeightedSum: ``sum_j weight_j * score_j``; a missing score counts 0.
- MajorityVote: each verifier that scored votes correct when its score is >= 0.5; reward 1 when more vote correct
  than not, 0 when fewer, 0.5 on a tie or with no votes. Weights are ignored.
- WeakSupervision (Weaver): a sliding window of recent score rows; at each fit, per verifier the window's min and
  max (frozen until the next fit) normalise scores to [0, 1], ``threshold`` binarises them, verifiers with an
  extreme positive rate or duplicating an earlier verifier are dropped (they abstain), and ``LabelModel`` is fitted
  on the remaining votes. Reward = P(correct). First fit once the window holds ``min_items`` rows, then every
  ``refit_every_steps`` optimizer steps; before the first fit the reward is the mean vote.
"""
from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
import numpy.typing as npt

from kubeforge.api import rljob
from kubeforge.runtime.verifiers.weak import LabelModel

Array = npt.NDArray[np.float64]
State = dict[str, dict[str, float | None]]


class Aggregator(Protocol):
    def rewards(self, scores: Array, *, step: int) -> Array:
        """One reward per row of ``scores`` ([completions, verifiers], NaN = no score)."""

    def state(self) -> State:
        """Per-verifier ``accuracy`` (None when not estimated) and ``weight`` in the reward."""


class WeightedSum:
    def __init__(self, names: Sequence[str], weights: Sequence[float]) -> None:
        self.names = list(names)
        self.weights = np.asarray(weights, dtype=np.float64)

    def rewards(self, scores: Array, *, step: int) -> Array:
        out: Array = np.einsum("ij,j->i", np.nan_to_num(scores, nan=0.0), self.weights)
        return out

    def state(self) -> State:
        return {"accuracy": {n: None for n in self.names},
                "weight": {n: float(w) for n, w in zip(self.names, self.weights)}}


class MajorityVote:
    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def rewards(self, scores: Array, *, step: int) -> Array:
        seen = ~np.isnan(scores)
        yes = (np.where(seen, scores, 0.0) >= 0.5).sum(axis=1)
        no = seen.sum(axis=1) - yes
        return np.where(yes > no, 1.0, np.where(yes < no, 0.0, 0.5))

    def state(self) -> State:
        return {"accuracy": {n: None for n in self.names}, "weight": {n: 1.0 for n in self.names}}


class WeakSupervision:
    def __init__(self, names: Sequence[str], spec: rljob.WeakSupervisionSpec) -> None:
        self.names = list(names)
        self.spec = spec
        n = len(self.names)
        self._window = np.full((spec.window, n), np.nan)
        self._filled = 0
        self._next = 0
        self.model: LabelModel | None = None
        self.fitted_step: int | None = None
        self.fits = 0
        self.lo = np.zeros(n)
        self.hi = np.ones(n)
        self.keep = np.ones(n, dtype=bool)
        self.positive_rate = np.full(n, np.nan)

    # -- online use
    def rewards(self, scores: Array, *, step: int) -> Array:
        self._append(scores)
        due = (self.model is None and self._filled >= self.spec.min_items) or (
            self.model is not None and self.fitted_step is not None
            and step >= self.fitted_step + self.spec.refit_every_steps)
        if due:
            self.fit(step=step)
        votes = self.votes(scores)
        if self.model is None:
            mean: Array = np.nan_to_num(np.nanmean(np.where(np.isnan(votes).all(axis=1, keepdims=True), 0.5, votes),
                                                   axis=1), nan=0.5)
            return mean
        proba: Array = self.model.predict_proba(votes[:, self.keep])
        return proba

    def fit(self, *, step: int) -> None:
        """Refit normalisation, dropped verifiers and the label model on the window."""
        w = self._window[: self._filled]
        with np.errstate(all="ignore"):
            self.lo = np.nan_to_num(np.nanmin(w, axis=0), nan=0.0)
            self.hi = np.nan_to_num(np.nanmax(w, axis=0), nan=1.0)
        v = self.votes(w)
        with np.errstate(all="ignore"):
            self.positive_rate = np.nanmean(v, axis=0)
        rate = np.nan_to_num(self.positive_rate, nan=0.0)
        keep = (rate >= self.spec.min_positive_rate) & (rate <= self.spec.max_positive_rate)
        ones, zeros = (v == 1.0).astype(np.float64), (v == 0.0).astype(np.float64)
        both = np.einsum("ij,ik->jk", ones + zeros, ones + zeros)
        agree = (np.einsum("ij,ik->jk", ones, ones) + np.einsum("ij,ik->jk", zeros, zeros)) / np.maximum(both, 1.0)
        for j in range(len(self.names)):
            if keep[j] and any(keep[i] and both[i, j] > 0 and agree[i, j] > self.spec.duplicate_agreement
                               for i in range(j)):
                keep[j] = False
        self.keep = keep
        self.model = LabelModel(class_balance=self.spec.class_balance).fit(v[:, keep]) if keep.any() else None
        self.fitted_step = step
        self.fits += 1

    def votes(self, scores: Array) -> Array:
        """Normalised with the frozen min/max and binarised: 1.0 / 0.0, NaN = no vote."""
        span = self.hi - self.lo
        norm = np.where(span > 1e-12, (scores - self.lo) / np.where(span > 1e-12, span, 1.0), scores)
        return np.where(np.isnan(norm), np.nan, (norm >= self.spec.threshold).astype(np.float64))

    def state(self) -> State:
        acc: dict[str, float | None] = {n: None for n in self.names}
        weight: dict[str, float | None] = {n: 0.0 for n in self.names}
        if self.model is not None:
            kept = [n for n, k in zip(self.names, self.keep) if k]
            for n, a, w in zip(kept, self.model.accuracies_, self.model.weights_):
                acc[n], weight[n] = float(a), float(w)
        return {"accuracy": acc, "weight": weight}

    def _append(self, scores: Array) -> None:
        cap = len(self._window)
        for row in scores[-cap:]:
            self._window[self._next] = row
            self._next = (self._next + 1) % cap
            self._filled = min(self._filled + 1, cap)


def build(reward: rljob.RewardSpec, verifiers: Sequence[rljob.VerifierSpec]) -> Aggregator:
    names = [v.name for v in verifiers]
    kind = rljob.Aggregation(reward.aggregation)
    if kind is rljob.Aggregation.MAJORITY_VOTE:
        return MajorityVote(names)
    if kind is rljob.Aggregation.WEAK_SUPERVISION:
        return WeakSupervision(names, reward.weak_supervision)
    return WeightedSum(names, [v.weight for v in verifiers])
