"""The weak-supervision label model: each verifier's accuracy from agreement alone, then P(correct) per item.

Neighbours: ``aggregate.WeakSupervision`` feeds it binarised votes of the recent window and uses
``predict_proba`` as the reward; tests and ``bench/bench_verifiers.py`` call it directly. Pure numpy.

Model (one-coin, after Dawid-Skene / Snorkel-MeTaL / FlyingSquid): the true label ``y`` is correct with probability
``pi`` (the class balance); verifier ``j`` votes ``y`` with probability ``a_j`` (its accuracy, the same for both
classes), independently of the others given ``y``. In ±1 form, ``E[v_i v_j] = mu_i mu_j`` with ``mu = 2a - 1``,
whatever ``pi`` is, so the agreement matrix ``M`` identifies each ``mu_j`` from triplets:
``mu_j^2 = M_jk M_jl / M_kl``. ``fit`` takes the median over every triplet (robust to a few correlated pairs),
flags pairs that agree more than the fitted model explains as dependent, and refits without the triplets that use
them. ``pi`` is given or estimated by least squares from ``E[v_j] = mu_j (2 pi - 1)``. ``predict_proba`` is the
posterior: ``logit(pi) + sum_j v_j w_j`` with ``w_j = log(a_j / (1 - a_j))`` over the verifiers that voted, each
weight divided by (1 + its number of dependent partners) so a duplicated verifier is not counted twice.

Invariants: accuracies lie in ``[0.5, ACC_MAX]`` (verifiers are assumed better than chance); NaN votes are
abstentions and never contribute; with fewer than three verifiers the triplet method is not identified: two
verifiers share ``sqrt(|M_12|)``, one gets ``DEFAULT_ACCURACY``.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

ACC_MAX = 0.995
DEFAULT_ACCURACY = 0.75
MIN_DENOMINATOR = 0.02      # triplets whose M_kl is smaller than this are uninformative (division blows up)
DEPENDENCY_MARGIN = 0.1     # agreement above mu_k mu_l + this (and its sampling noise) flags a dependent pair


class LabelModel:
    """``LabelModel(class_balance=None).fit(votes)``; then ``accuracies_``, ``class_balance_``, ``weights_``,
    ``dependent_`` (pairs) and ``predict_proba(votes)``."""

    def __init__(self, class_balance: float | None = None) -> None:
        if class_balance is not None and not 0.0 < class_balance < 1.0:
            raise ValueError(f"class_balance must be in (0, 1), got {class_balance}")
        self.class_balance = class_balance
        self.accuracies_: Array = np.zeros(0)
        self.weights_: Array = np.zeros(0)
        self.class_balance_: float = class_balance if class_balance is not None else 0.5
        self.dependent_: list[tuple[int, int]] = []

    # ------------------------------------------------------------------ fit
    def fit(self, votes: npt.ArrayLike) -> LabelModel:
        v = _check(votes)
        x = 2.0 * v - 1.0                       # ±1, NaN = abstain
        seen = ~np.isnan(x)
        xz = np.where(seen, x, 0.0)
        # einsum, not BLAS: a threaded BLAS on a busy machine takes 100x longer on these thin matrices
        sf = seen.astype(np.float64)
        counts = np.einsum("ij,ik->jk", sf, sf)
        m = np.einsum("ij,ik->jk", xz, xz) / np.maximum(counts, 1.0)
        n_verifiers = v.shape[1]
        dep = np.zeros((n_verifiers, n_verifiers), dtype=bool)
        mu = _mu(m, dep)
        if n_verifiers >= 4:                    # a dependent pair can be told apart only with others to compare
            noise = 3.0 / np.sqrt(np.maximum(counts, 1.0))
            dep = (m - np.outer(mu, mu)) > DEPENDENCY_MARGIN + noise
            np.fill_diagonal(dep, False)
            if dep.any():
                mu = _mu(m, dep)
        self.dependent_ = [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(dep)))]
        acc = np.clip((1.0 + mu) / 2.0, 0.5, ACC_MAX)
        self.accuracies_ = acc
        self.weights_ = np.log(acc / (1.0 - acc)) / (1.0 + dep.sum(axis=1))
        if self.class_balance is None:
            mean_vote = np.nanmean(np.where(seen.any(axis=0), x, 0.0), axis=0) if len(x) else np.zeros(n_verifiers)
            mean_vote = np.nan_to_num(mean_vote)
            denom = float(np.sum(mu * mu))
            balance = 0.5 * (1.0 + float(np.sum(mu * mean_vote)) / denom) if denom > 1e-9 else 0.5
            self.class_balance_ = float(np.clip(balance, 0.01, 0.99))
        else:
            self.class_balance_ = self.class_balance
        return self

    # ------------------------------------------------------------------ predict
    def predict_proba(self, votes: npt.ArrayLike) -> Array:
        """P(correct) for each item (row) of ``votes``."""
        v = _check(votes)
        if v.shape[1] != len(self.weights_):
            raise ValueError(f"votes have {v.shape[1]} verifiers, the model was fitted on {len(self.weights_)}")
        x = np.nan_to_num(2.0 * v - 1.0, nan=0.0)
        pi = self.class_balance_
        logit = np.log(pi / (1.0 - pi)) + np.einsum("ij,j->i", x, self.weights_)
        proba: Array = 1.0 / (1.0 + np.exp(-np.clip(logit, -60.0, 60.0)))
        return proba


def _check(votes: npt.ArrayLike) -> Array:
    v = np.asarray(votes, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"votes must be a 2-d array [items, verifiers], got shape {v.shape}")
    ok = np.isnan(v) | (v == 0.0) | (v == 1.0)
    if not ok.all():
        raise ValueError("votes must be 0, 1 or NaN (no vote)")
    return v


def _mu(m: Array, dep: npt.NDArray[np.bool_]) -> Array:
    """``mu_j = median over triplets (j, k, l) of sqrt(|M_jk M_jl / M_kl|)``, leaving out dependent pairs."""
    n = m.shape[0]
    if n == 1:
        return np.array([2.0 * DEFAULT_ACCURACY - 1.0])
    if n == 2:
        return np.full(2, np.sqrt(abs(m[0, 1])))
    out = np.empty(n)
    idx = np.arange(n)
    for j in range(n):
        others = idx[idx != j]
        k, l = np.meshgrid(others, others, indexing="ij")
        sel = k < l
        k, l = k[sel], l[sel]
        ok = (np.abs(m[k, l]) >= MIN_DENOMINATOR) & ~dep[j, k] & ~dep[j, l] & ~dep[k, l]
        if not ok.any():
            ok = np.abs(m[k, l]) >= MIN_DENOMINATOR
        if not ok.any():
            out[j] = 2.0 * DEFAULT_ACCURACY - 1.0
            continue
        k, l = k[ok], l[ok]
        out[j] = float(np.median(np.sqrt(np.abs(m[j, k] * m[j, l] / m[k, l]))))
    return np.clip(out, 0.0, 2.0 * ACC_MAX - 1.0)
