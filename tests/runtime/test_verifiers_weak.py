"""The weak-supervision label model on synthetic votes with known accuracies, and the online WeakSupervision
aggregation (window, normalisation, dropped verifiers, refits)."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from kubeforge.api import rljob
from kubeforge.runtime import types, verifiers
from kubeforge.runtime.verifiers import aggregate
from kubeforge.runtime.verifiers.weak import LabelModel

ACCURACIES = [0.55, 0.58, 0.6, 0.63, 0.66, 0.7, 0.72, 0.75, 0.78, 0.8]
CORRELATED = ((9, 2, 0.6), (4, 6, 0.5))   # verifier a copies verifier b's vote with this probability


def simulate(n: int, seed: int, balance: float = 0.35) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    rng = np.random.default_rng(seed)
    y = rng.random(n) < balance
    votes = np.empty((n, len(ACCURACIES)))
    for j, a in enumerate(ACCURACIES):
        votes[:, j] = np.where(rng.random(n) < a, y, ~y)
    for a, b, p in CORRELATED:
        votes[:, a] = np.where(rng.random(n) < p, votes[:, b], votes[:, a])
    votes[rng.random(votes.shape) < 0.05] = np.nan      # abstentions
    return votes, y


def auc(score: npt.NDArray[np.float64], y: npt.NDArray[np.bool_]) -> float:
    """Area under the ROC curve (Mann-Whitney, ties counted half)."""
    order = np.argsort(score, kind="mergesort")
    s = score[order]
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = np.empty(len(s))
    ranks[order] = ((ends - counts + 1 + ends) / 2.0)[inverse]
    pos = int(y.sum())
    neg = len(y) - pos
    return float((ranks[y].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


@pytest.mark.parametrize("seed", [0, 1])
def test_label_model_recovers_accuracies_and_ranks_better(seed: int) -> None:
    votes, y = simulate(20000, seed)
    true = np.array([np.mean(votes[~np.isnan(votes[:, j]), j] == y[~np.isnan(votes[:, j])])
                     for j in range(votes.shape[1])])      # the correlated ones' accuracies, as realised
    lm = LabelModel().fit(votes)
    err = np.abs(lm.accuracies_ - true)
    print(f"\nseed {seed}: true {np.round(true, 3)}\n        est  {np.round(lm.accuracies_, 3)}  max err "
          f"{err.max():.3f}; class balance {lm.class_balance_:.3f} (true {y.mean():.3f}); dependent {lm.dependent_}")
    assert err.max() <= 0.05
    assert sorted(lm.dependent_) == sorted(tuple(sorted((a, b))) for a, b, _ in CORRELATED)
    assert abs(lm.class_balance_ - y.mean()) < 0.05
    mean = np.nanmean(votes, axis=1)
    majority = np.where(mean > 0.5, 1.0, np.where(mean < 0.5, 0.0, 0.5))
    a_lm, a_mean, a_mv = auc(lm.predict_proba(votes), y), auc(mean, y), auc(majority, y)
    print(f"AUC: label model {a_lm:.4f}, mean score {a_mean:.4f}, majority vote {a_mv:.4f}")
    assert a_lm > a_mean + 0.005 and a_lm > a_mv + 0.005


def test_label_model_given_class_balance_and_input_checks() -> None:
    votes, y = simulate(5000, 3, balance=0.5)
    lm = LabelModel(class_balance=0.5).fit(votes)
    assert lm.class_balance_ == 0.5
    p = lm.predict_proba(votes)
    assert p.shape == (5000,) and np.all((p > 0) & (p < 1))
    assert np.mean((p > 0.5) == y) > 0.85
    with pytest.raises(ValueError, match="0, 1 or NaN"):
        LabelModel().fit(np.array([[0.3, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="2-d"):
        LabelModel().fit(np.zeros(4))
    with pytest.raises(ValueError, match="class_balance"):
        LabelModel(class_balance=1.0)
    with pytest.raises(ValueError, match="verifiers"):
        lm.predict_proba(np.zeros((2, 3)))


def test_label_model_with_few_verifiers_is_defined() -> None:
    one = LabelModel().fit(np.array([[1.0], [0.0], [1.0]]))
    assert one.accuracies_.tolist() == [0.75]
    two = LabelModel().fit(np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]))
    assert two.accuracies_[0] == two.accuracies_[1] and 0.5 <= two.accuracies_[0] <= 1.0


def weak_spec(**kw: object) -> rljob.WeakSupervisionSpec:
    return rljob.WeakSupervisionSpec.model_validate({"minItems": 64, "refitEverySteps": 2, **kw})


def test_online_weak_supervision_normalises_drops_and_refits() -> None:
    """Scores on other scales are min-max normalised; a constant verifier (extreme positive rate) and a duplicate
    are dropped; the first fit comes with minItems rows, refits every refitEverySteps steps."""
    rng = np.random.default_rng(7)
    names = [f"v{j}" for j in range(6)] + ["always", "copy"]
    agg = aggregate.WeakSupervision(names, weak_spec())
    y_all: list[bool] = []
    r_all: list[float] = []
    for step in range(12):
        for _ in range(8):                                 # 8 groups of 8 completions per step
            y = rng.random(8) < 0.5
            cols = [np.where(rng.random(8) < a, y, ~y).astype(float) for a in (0.6, 0.65, 0.7, 0.75, 0.8, 0.85)]
            cols[0] = cols[0] * 10.0 - 5.0                 # a reward model's scale: -5 / 5
            cols += [np.ones(8), cols[5].copy()]
            r = agg.rewards(np.stack(cols, axis=1), step=step)
            assert r.shape == (8,) and np.all((r >= 0) & (r <= 1))
            if step >= 1:
                y_all += list(y)
                r_all += list(r)
    assert agg.fits == 6                                   # step 0 (64 rows), then steps 2, 4, 6, 8, 10
    assert agg.keep.tolist() == [True] * 6 + [False, False]
    st = agg.state()
    assert st["accuracy"]["always"] is None and st["weight"]["copy"] == 0.0
    acc = [st["accuracy"][f"v{j}"] for j in range(6)]
    assert all(a is not None for a in acc)
    assert abs(acc[0] - 0.6) < 0.1 and abs(acc[5] - 0.85) < 0.1
    assert auc(np.array(r_all), np.array(y_all)) > 0.9


def test_scorer_with_weak_supervision_gives_probabilities() -> None:
    specs = [rljob.VerifierSpec.model_validate({"name": n, "type": "Regex", "regex": {"pattern": p}})
             for n, p in (("a", "1"), ("b", "1|2"), ("c", "1|3"))]
    reward = rljob.RewardSpec.model_validate({"aggregation": "WeakSupervision", "weakSupervision": {"minItems": 8}})
    s = verifiers.Scorer(specs, reward=reward)
    rng = np.random.default_rng(0)
    for step in range(4):
        texts = ["".join(rng.choice(list("0123"), 3)) for _ in range(8)]
        g = types.RolloutGroup(prompt=types.Prompt(index=step, text="q", answer=""), prompt_token_ids=[1],
                               completions=[types.Completion(token_ids=[], logprobs=[], text=t) for t in texts],
                               policy_version=0, step=step)
        rewards, scores = s.score_group(g)
        assert all(0.0 <= r <= 1.0 for r in rewards) and set(scores) == {"a", "b", "c"}
    assert s.state()["accuracy"]["a"] is not None
