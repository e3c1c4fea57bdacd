"""Trainer–sampler mismatch (grpo/mismatch.py): the measured figures, TIS and the sequence mask, hand-computed.

The example of test_grpo: two completions, T = 3; ratios trainer / behaviour r = exp(logp - behaviour):
  row 0: 2 tokens (mask 1 1 0), advantage +1, r = 1.5, 0.9
  row 1: 3 tokens (mask 1 1 1), advantage -1, r = 0.5, 1.1, 1.0
"""
from __future__ import annotations

import math

import pytest
import torch

import _trainer_util as util
from kubeforge.api import rljob
from kubeforge.runtime.grpo import grpo, inputs, mismatch
from kubeforge.runtime.learner import step
from test_grpo import SYM, example


def test_stats_hand_computed() -> None:
    b = example()
    st = mismatch.stats(logp=b.logp, behaviour_logp=b.behaviour_logp, mask=b.mask)
    # k3 = r - 1 - ln r: 1.5 -> 0.0945349; 0.9 -> 0.0053605; 0.5 -> 0.1931472; 1.1 -> 0.0046898; 1.0 -> 0
    want = sum(r - 1 - math.log(r) for r in (1.5, 0.9, 0.5, 1.1, 1.0))
    assert st.kl_sum == pytest.approx(want, abs=1e-6) and st.kl_sum == pytest.approx(0.2977324, abs=1e-6)
    assert st.tokens == 5 and st.rows == 2 and st.masked == 0
    assert st.max_ratio == pytest.approx(1.5, abs=1e-6)       # the padded column (r = 1 there) is not counted


def test_tis_hand_computed() -> None:
    # importanceCap C = 1.2: ratio against the trainer's own logp (value 1: never clipped), per-token weight
    # w = min(r, 1.2): row 0: 1.2, 0.9; row 1: 0.5, 1.1, 1.0. Token loss = -A * w.
    # GRPO: row 0 mean (-1.2 - 0.9)/2 = -1.05; row 1 (0.5 + 1.1 + 1.0)/3 = 0.866667; mean over rows -0.0916667
    b = example()
    out = grpo.loss(batch=b, settings=inputs.LossSettings(clip_low=0.2, clip_high=0.2, importance_cap=1.2))
    assert out.loss.item() == pytest.approx((-1.05 + 2.6 / 3) / 2, abs=1e-6)
    assert out.clip_fraction == 0.0 and out.ratio_mean == pytest.approx(1.0)
    out.loss.backward()
    # d(-A * w * exp(logp - logp.detach()))/dlogp = -A * w, / tokens of the row / 2 rows
    want = [[-1.2 / 4, -0.9 / 4, 0.0], [0.5 / 6, 1.1 / 6, 1.0 / 6]]
    assert b.logp.grad is not None
    assert b.logp.grad.tolist() == [pytest.approx(r, abs=1e-6) for r in want]


def test_tis_cap_at_least_the_largest_ratio_is_plain_importance_weighting() -> None:
    # C = 10 > every r: w = r, and with ratio 1 the loss is -A * r per token: row 0 (-1.5 - 0.9)/2 = -1.2,
    # row 1 (0.5 + 1.1 + 1.0)/3 = 0.866667 -> -0.1666667
    out = grpo.loss(batch=example(), settings=inputs.LossSettings(importance_cap=10.0))
    assert out.loss.item() == pytest.approx((-1.2 + 2.6 / 3) / 2, abs=1e-6)


@pytest.mark.parametrize(("level", "threshold", "masked_rows"), [
    ("Max", 0.5, [1]),       # max |ln r|: row 0 ln 1.5 = 0.405 <= 0.5; row 1 |ln 0.5| = 0.693 > 0.5
    ("Max", 0.7, []),
    ("Mean", 0.26, [1]),     # mean |ln r|: row 0 (0.405 + 0.105)/2 = 0.2554; row 1 (0.693 + 0.0953 + 0)/3 = 0.2628
    ("Mean", 0.25, [0, 1]),
])
def test_sequence_mask_hand_computed(level: str, threshold: float, masked_rows: list[int]) -> None:
    b = example()
    settings = inputs.LossSettings(clip_low=0.2, clip_high=0.2, mismatch_mask_level=level,
                                   mismatch_mask_threshold=threshold)
    out = grpo.loss(batch=b, settings=settings)
    # unmasked GRPO per-row means (test_grpo): row 0 -1.05, row 1 0.966667; a masked row contributes 0 and still
    # counts in the denominator (2 rows)
    per_row = [-1.05, 2.9 / 3]
    want = sum(v for i, v in enumerate(per_row) if i not in masked_rows) / 2
    assert out.loss.item() == pytest.approx(want, abs=1e-6)
    assert out.denominator == 2.0
    lr = mismatch.log_ratio(logp=b.logp, behaviour_logp=b.behaviour_logp, mask=b.mask)
    keep = mismatch.keep_of(log_ratio=lr, mask=b.mask, level=level, threshold=threshold)
    st = mismatch.stats(logp=b.logp, behaviour_logp=b.behaviour_logp, mask=b.mask, keep=keep)
    assert st.masked == len(masked_rows)


def test_extreme_log_ratios_stay_finite() -> None:
    logp = torch.tensor([[-0.1, -200.0]], requires_grad=True)
    b = inputs.LossInputs(logp=logp, behaviour_logp=torch.tensor([[-300.0, -0.1]]), mask=torch.ones(1, 2),
                          advantages=torch.tensor([1.0]))
    out = grpo.loss(batch=b, settings=inputs.LossSettings(importance_cap=2.0, mismatch_mask_level="Max",
                                                          mismatch_mask_threshold=50.0))
    out.loss.backward()
    st = mismatch.stats(logp=logp, behaviour_logp=b.behaviour_logp, mask=b.mask)
    assert math.isfinite(out.loss.item()) and torch.isfinite(logp.grad).all()   # type: ignore[arg-type]
    assert math.isfinite(st.kl_sum) and st.max_ratio == pytest.approx(math.exp(mismatch.LOG_RATIO_LIMIT))


def test_settings_from_spec() -> None:
    algo = rljob.AlgorithmSpec.model_validate({"importanceCap": 2.0, "mismatchMask": {"threshold": 1.0}})
    s = inputs.LossSettings.from_spec(algo)
    assert (s.importance_cap, s.mismatch_mask_level, s.mismatch_mask_threshold) == (2.0, "Max", 1.0)
    off = inputs.LossSettings.from_spec(rljob.AlgorithmSpec())
    assert (off.importance_cap, off.mismatch_mask_level, off.mismatch_mask_threshold) == (None, None, None)
    assert SYM.importance_cap is None


def test_train_step_reports_the_mismatch(tmp_path: object) -> None:
    """On-policy groups (the trainer's own logprobs as behaviour): KL ~ 0 and max ratio ~ 1; the behaviour
    logprobs shifted by -ln 2 (the sampler thought every token half as likely): r = 2 everywhere, k3 = 1 - ln 2."""
    import pathlib

    tiny = util.build_tiny(pathlib.Path(str(tmp_path)) / "model")
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(maxNewTokens=3, learningRate=1e-9))
    groups = util.on_policy_groups(t.model, step=0, version=0, prompts=2, group_size=4, max_new=3, seed=0)
    m = t.train_step(groups=groups)
    assert m.logprob_mismatch_kl == pytest.approx(0.0, abs=1e-6)
    assert m.logprob_mismatch_max_ratio == pytest.approx(1.0, abs=1e-3)
    assert m.mismatch_masked_fraction == 0.0 and m.truncation_outside_tokens == 0
    for g in groups:
        for c in g.completions:
            c.logprobs[:] = c.logprobs - math.log(2.0)
    m = t.train_step(groups=groups)
    assert m.logprob_mismatch_kl == pytest.approx(1 - math.log(2.0), abs=1e-3)
    assert m.logprob_mismatch_max_ratio == pytest.approx(2.0, rel=1e-3)
