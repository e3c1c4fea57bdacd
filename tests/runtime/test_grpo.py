"""GRPO maths against hand-computed examples: advantages, each loss variant, clipping, k3 KL."""
from __future__ import annotations

import math

import pytest
import torch

from kubeforge.api import rljob
from kubeforge.runtime.grpo import advantages, dapo, drgrpo, grpo, inputs, kl, registry

EPS = 1e-4


# ---------------------------------------------------------------- advantages

def test_grpo_advantages_hand_computed() -> None:
    # group 1: r = [1, 0, 0, 1]: mean 0.5; population std sqrt(((.5)^2 * 4) / 4) = 0.5
    #          A = (r - 0.5) / (0.5 + 1e-4) = +-0.5 / 0.5001 = +-0.99980004
    # group 2: r = [0, 3]: mean 1.5, std 1.5 -> A = +-1.5 / 1.5001 = +-0.99993334
    # group 3: r = [2, 2]: mean 2, std 0 -> A = 0 / 1e-4 = 0 (no signal)
    a = advantages.group_advantages(rewards=[[1, 0, 0, 1], [0, 3], [2, 2]], scale_by_std=True, eps=EPS)
    want = [0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001, -1.5 / 1.5001, 1.5 / 1.5001, 0.0, 0.0]
    assert a.tolist() == pytest.approx(want, abs=1e-6)


def test_drgrpo_advantages_do_not_divide_by_std() -> None:
    # r - mean only: [1,0,0,1] -> [.5,-.5,-.5,.5]; [0,3] -> [-1.5, 1.5]
    a = advantages.group_advantages(rewards=[[1, 0, 0, 1], [0, 3]], scale_by_std=False)
    assert a.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, -1.5, 1.5], abs=1e-7)


def test_empty_group_is_refused() -> None:
    with pytest.raises(ValueError, match=r"rewards\[1\]"):
        advantages.group_advantages(rewards=[[1.0], []], scale_by_std=True)


# ---------------------------------------------------------------- the shared example
#
# Two completions, T = 3 columns.
#   row 0: 2 tokens (mask 1 1 0), advantage +1, ratios exp(logp - behaviour) = 1.5, 0.9
#   row 1: 3 tokens (mask 1 1 1), advantage -1, ratios 0.5, 1.1, 1.0
# Per-token loss = -min(r * A, clip(r, 1 - lo, 1 + hi) * A).

def example(*, ref: torch.Tensor | None = None) -> inputs.LossInputs:
    behaviour = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]])
    ratios = torch.tensor([[1.5, 0.9, 1.0], [0.5, 1.1, 1.0]])
    logp = (behaviour + ratios.log()).requires_grad_(True)
    return inputs.LossInputs(logp=logp, behaviour_logp=behaviour, mask=torch.tensor([[1.0, 1, 0], [1, 1, 1]]),
                             advantages=torch.tensor([1.0, -1.0]), ref_logp=ref)


SYM = inputs.LossSettings(clip_low=0.2, clip_high=0.2, max_tokens=4)
# With the symmetric clip [0.8, 1.2]:
#   row 0 (A=+1): r=1.5 -> min(1.5, 1.2) = 1.2 -> -1.2 (clipped); r=0.9 -> -0.9
#   row 1 (A=-1): r=0.5 -> min(-0.5, -0.8) = -0.8 -> +0.8 (clipped); r=1.1 -> +1.1; r=1.0 -> +1.0
#   clip fraction 2/5 = 0.4; ratio mean (1.5+0.9+0.5+1.1+1.0)/5 = 1.0


def test_grpo_loss_hand_computed() -> None:
    out = grpo.loss(batch=example(), settings=SYM)
    # per-sequence means: row 0 (-1.2 - 0.9)/2 = -1.05; row 1 (0.8 + 1.1 + 1.0)/3 = 0.966667
    # batch mean: (-1.05 + 0.966667)/2 = -0.0416667
    assert out.loss.item() == pytest.approx((-1.05 + 2.9 / 3) / 2, abs=1e-6)
    assert out.denominator == 2.0
    assert out.clip_fraction == pytest.approx(0.4)
    assert out.ratio_mean == pytest.approx(1.0)
    assert out.tokens == 5
    assert out.kl == 0.0


def test_drgrpo_loss_hand_computed() -> None:
    out = drgrpo.loss(batch=example(), settings=SYM)
    # sums over tokens / constant 4: row 0 -2.1/4 = -0.525; row 1 2.9/4 = 0.725; mean over 2 rows = 0.1
    assert out.loss.item() == pytest.approx(0.1, abs=1e-6)
    assert out.denominator == 2.0


def test_dapo_loss_hand_computed_with_clip_higher() -> None:
    out = dapo.loss(batch=example(), settings=inputs.LossSettings(clip_low=0.2, clip_high=0.28))
    # clip range [0.8, 1.28]: row 0 r=1.5 -> min(1.5, 1.28) -> -1.28; r=0.9 -> -0.9
    #                         row 1 r=0.5 -> +0.8; r=1.1 -> +1.1; r=1.0 -> +1.0
    # token mean: (-1.28 - 0.9 + 0.8 + 1.1 + 1.0) / 5 = 0.72 / 5 = 0.144
    assert out.loss.item() == pytest.approx(0.144, abs=1e-6)
    assert out.denominator == 5.0
    assert out.clip_fraction == pytest.approx(0.4)


def test_clipped_tokens_get_no_gradient_and_others_do() -> None:
    batch = example()
    grpo.loss(batch=batch, settings=SYM).loss.backward()
    g = batch.logp.grad
    assert g is not None
    # loss = mean over rows of mean over tokens of -r*A; d(-r*A)/dlogp = -r*A (r = exp(logp - behaviour))
    # row 0 (2 tokens, 2 rows): token 0 clipped -> 0; token 1: -0.9 * 1 / 2 / 2 = -0.225; pad -> 0
    # row 1 (3 tokens): token 0 clipped -> 0; token 1: +1.1 / 3 / 2 = 0.183333; token 2: +1.0 / 6 = 0.166667
    want = [[0.0, -0.225, 0.0], [0.0, 1.1 / 6, 1.0 / 6]]
    assert g.tolist() == [pytest.approx(r, abs=1e-6) for r in want]


def test_pessimistic_bound_keeps_gradient_for_bad_tokens_grown_too_much() -> None:
    # A = -1 and r = 1.5 > 1.2: min(-1.5, -1.2) = -1.5 keeps the unclipped term, so the gradient still pushes
    # the token down (PPO's pessimism); loss = 1.5, d/dlogp = -r*A = 1.5
    logp = torch.tensor([[math.log(1.5)]], requires_grad=True)
    b = inputs.LossInputs(logp=logp, behaviour_logp=torch.zeros(1, 1), mask=torch.ones(1, 1),
                          advantages=torch.tensor([-1.0]))
    out = grpo.loss(batch=b, settings=SYM)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(1.5)
    assert out.clip_fraction == 0.0
    assert logp.grad is not None and float(logp.grad) == pytest.approx(1.5)


def test_ratio_is_against_behaviour_logprobs_not_a_detached_copy() -> None:
    # The torchforge bug used exp(lp - lp.detach()) == 1 always. Here logp != behaviour, so the ratio is not 1.
    out = grpo.loss(batch=example(), settings=inputs.LossSettings(clip_low=10.0, clip_high=10.0))
    # no clipping: row 0 mean -(1.5 + 0.9)/2 = -1.2; row 1 mean (0.5 + 1.1 + 1.0)/3 = 0.866667 -> (-1.2+0.866667)/2
    assert out.loss.item() == pytest.approx((-1.2 + 2.6 / 3) / 2, abs=1e-6)


def test_k3_value() -> None:
    # logp = ln 0.5, ref = ln 0.25: d = ref - logp = ln 0.5 = -0.693147
    # k3 = exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147
    v = kl.k3(logp=torch.tensor([math.log(0.5)]), ref_logp=torch.tensor([math.log(0.25)]))
    assert float(v) == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)
    assert float(kl.k3(logp=torch.tensor([-1.3]), ref_logp=torch.tensor([-1.3]))) == 0.0


def test_kl_penalty_adds_to_loss() -> None:
    # one token, ratio 1, A = 0 -> surrogate 0; kl_coef 0.1 * k3 0.193147 = 0.0193147
    b = inputs.LossInputs(logp=torch.tensor([[math.log(0.5)]]), behaviour_logp=torch.tensor([[math.log(0.5)]]),
                          mask=torch.ones(1, 1), advantages=torch.tensor([0.0]),
                          ref_logp=torch.tensor([[math.log(0.25)]]))
    out = grpo.loss(batch=b, settings=inputs.LossSettings(kl_coef=0.1))
    assert out.loss.item() == pytest.approx(0.1 * (0.5 + math.log(2) - 1), abs=1e-7)
    assert out.kl == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)


def test_kl_needs_reference() -> None:
    with pytest.raises(ValueError, match="ref_logp"):
        grpo.loss(batch=example(), settings=inputs.LossSettings(kl_coef=0.1))


def test_registry_maps_every_loss_type() -> None:
    assert registry.variant_for(rljob.LossType.GRPO).loss is grpo.loss
    assert registry.variant_for("DrGRPO").loss is drgrpo.loss
    assert not registry.variant_for("DrGRPO").scale_advantages_by_std
    assert registry.variant_for(rljob.LossType.DAPO).loss is dapo.loss
    assert set(registry.VARIANTS) == set(rljob.LossType)
    with pytest.raises(ValueError, match="spec.algorithm.loss"):
        registry.variant_for("PPO")


def test_settings_from_spec_default_high_to_low() -> None:
    s = inputs.LossSettings.from_spec(rljob.AlgorithmSpec(clip_epsilon=0.1, max_new_tokens=7))
    assert (s.clip_low, s.clip_high, s.max_tokens) == (0.1, 0.1, 7)
    s = inputs.LossSettings.from_spec(rljob.AlgorithmSpec.model_validate(
        {"loss": "DAPO", "clipEpsilon": 0.2, "clipEpsilonHigh": 0.28}))
    assert (s.clip_low, s.clip_high) == (0.2, 0.28)
