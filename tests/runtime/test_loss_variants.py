"""The loss variants as their papers define them, against hand-computed values: GSPO's sequence-level ratio
(Zheng et al. 2025, arXiv 2507.18071) and DAPO's overlong punishment and dynamic sampling (Yu et al. 2025,
arXiv 2503.14476). The dynamic-sampling refill runs the real trainer role loop in-process, with a fake source of
scored groups and a fake learner."""
from __future__ import annotations

import collections
import math
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from kubeforge.api import load, rljob, validate
from kubeforge.runtime import types, wire
from kubeforge.runtime.grpo import gspo, inputs, overlong, registry
from kubeforge.runtime.learner import batch, dynamic_sampling
from kubeforge.runtime.trainer import loop as trainer_role


def algo(**fields: Any) -> rljob.AlgorithmSpec:
    """``spec.algorithm`` from its wire (camelCase) fields."""
    return rljob.AlgorithmSpec.model_validate(fields)


# ---------------------------------------------------------------- GSPO
#
# Two sequences, T = 3 columns.
#   row 0: 2 tokens, A = +1, log-ratios (logp - behaviour) = ln 1.5, ln 0.9
#          s_0 = exp((ln 1.5 + ln 0.9) / 2) = sqrt(1.35) = 1.161895
#   row 1: 3 tokens, A = -1, log-ratios ln 0.5, ln 1.1, ln 1.0
#          s_1 = (0.5 * 1.1 * 1.0) ** (1/3) = 0.55 ** (1/3) = 0.819321

S0, S1 = math.sqrt(1.35), 0.55 ** (1 / 3)


def gspo_example() -> inputs.LossInputs:
    behaviour = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, -2.5]], dtype=torch.float64)
    ratios = torch.tensor([[1.5, 0.9, 7.0], [0.5, 1.1, 1.0]], dtype=torch.float64)   # 7.0: padding, ignored
    logp = (behaviour + ratios.log()).requires_grad_(True)
    return inputs.LossInputs(logp=logp, behaviour_logp=behaviour,
                             mask=torch.tensor([[1.0, 1, 0], [1, 1, 1]], dtype=torch.float64),
                             advantages=torch.tensor([1.0, -1.0], dtype=torch.float64))


def test_gspo_sequence_ratio_is_the_length_normalised_likelihood_ratio() -> None:
    b = gspo_example()
    s = gspo.sequence_ratio(logp=b.logp, behaviour_logp=b.behaviour_logp, mask=b.mask)
    assert s.tolist() == pytest.approx([S0, S1], abs=1e-12)


def test_gspo_loss_hand_computed_wide_clip() -> None:
    # clip [0.5, 1.5] clips nothing: J = mean(s_0 * 1, s_1 * -1) = (1.161895 - 0.819321) / 2; loss = -J
    out = gspo.loss(batch=gspo_example(), settings=inputs.LossSettings(clip_low=0.5, clip_high=0.5))
    assert out.loss.item() == pytest.approx(-(S0 - S1) / 2, abs=1e-12)
    assert out.denominator == 2.0 and out.tokens == 5 and out.clip_fraction == 0.0
    assert out.ratio_mean == pytest.approx((2 * S0 + 3 * S1) / 5, abs=1e-12)     # token-weighted


def test_gspo_loss_hand_computed_paper_clip() -> None:
    # the paper's range [1 - 3e-4, 1 + 4e-4]: row 0 (A=+1): min(1.161895, 1.0004) = 1.0004 -> clipped
    # row 1 (A=-1): min(-0.819321, -0.9997) = -0.9997 -> clipped; loss = -(1.0004 - 0.9997) / 2 = -0.00035
    out = gspo.loss(batch=gspo_example(), settings=inputs.LossSettings(clip_low=3e-4, clip_high=4e-4))
    assert out.loss.item() == pytest.approx(-(1.0004 - 0.9997) / 2, abs=1e-12)
    assert out.clip_fraction == 1.0


def test_gspo_gradient_is_one_factor_per_sequence() -> None:
    # d(-s_i A_i)/d logp_i,t = -A_i * s_i / |y_i| for EVERY token of sequence i (the paper's eq. for grad J),
    # divided by the 2 sequences of the mean: row 0: -S0 / 2 / 2; row 1: +S1 / 3 / 2; padding 0
    b = gspo_example()
    gspo.loss(batch=b, settings=inputs.LossSettings(clip_low=0.5, clip_high=0.5)).loss.backward()
    assert b.logp.grad is not None
    want = [[-S0 / 4, -S0 / 4, 0.0], [S1 / 6, S1 / 6, S1 / 6]]
    assert b.logp.grad.tolist() == [pytest.approx(r, abs=1e-12) for r in want]


def test_gspo_clipped_sequence_gets_no_gradient_the_other_does() -> None:
    # clip [0.7, 1.1]: row 0 s=1.1619 > 1.1 with A>0 -> clipped, no gradient; row 1 s=0.8193 inside -> +S1/6 each
    b = gspo_example()
    out = gspo.loss(batch=b, settings=inputs.LossSettings(clip_low=0.3, clip_high=0.1))
    out.loss.backward()
    assert b.logp.grad is not None
    assert b.logp.grad.tolist() == [pytest.approx(r, abs=1e-12) for r in [[0, 0, 0], [S1 / 6] * 3]]
    assert out.clip_fraction == pytest.approx(2 / 5)          # row 0's two tokens of five


def test_gspo_equals_token_ratio_for_one_token_completions() -> None:
    # |y| = 1: s_i is the token ratio, and the sequence mean is GRPO's: the two losses agree
    behaviour = torch.tensor([[-1.0], [-2.0]])
    logp = behaviour + torch.tensor([[0.1], [-0.05]])
    b = inputs.LossInputs(logp=logp, behaviour_logp=behaviour, mask=torch.ones(2, 1),
                          advantages=torch.tensor([0.7, -0.7]))
    st = inputs.LossSettings(clip_low=0.2, clip_high=0.28)
    assert registry.variant_for("GSPO").loss(batch=b, settings=st).loss.item() == pytest.approx(
        registry.variant_for("GRPO").loss(batch=b, settings=st).loss.item(), abs=1e-7)


def test_gspo_kl_is_each_sequences_mean_k3() -> None:
    b = gspo_example()
    ref = b.logp.detach().clone()
    ref[0, 0] -= 0.5                                   # d = -0.5 at one token: k3 = e^-0.5 + 0.5 - 1
    k = math.exp(-0.5) - 0.5
    with_ref = inputs.LossInputs(logp=b.logp, behaviour_logp=b.behaviour_logp, mask=b.mask,
                                 advantages=b.advantages, ref_logp=ref)
    out = gspo.loss(batch=with_ref, settings=inputs.LossSettings(clip_low=0.5, clip_high=0.5, kl_coef=0.1))
    assert out.loss.item() == pytest.approx((-(S0 - S1) + 0.1 * k / 2) / 2, abs=1e-12)
    assert out.kl == pytest.approx(k / 5, abs=1e-12)


def test_registry_has_gspo_with_std_scaled_advantages() -> None:
    v = registry.variant_for(rljob.LossType.GSPO)
    assert v.loss is gspo.loss and v.scale_advantages_by_std


# ---------------------------------------------------------------- DAPO: soft overlong punishment
#
# L_max = 20, L_cache = 4 (expected length 16), penalty 1:
#   |y| = 10 -> 0; 16 -> 0; 17 -> (16 - 17)/4 = -0.25; 18 -> -0.5; 20 -> -1; truncated (|y| > L_max) -> -1

def test_overlong_length_reward_hand_computed() -> None:
    o = overlong.Overlong(max_tokens=20, buffer=4)
    assert [o.length_reward(n) for n in (10, 16, 17, 18, 19, 20, 21)] == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]
    assert o.length_reward(20, truncated=True) == -1.0
    half = overlong.Overlong(max_tokens=20, buffer=4, penalty=0.5)     # verl's overlong_penalty_factor
    assert half.length_reward(18) == -0.25 and half.length_reward(20, truncated=True) == -0.5


def _completion(n: int, reason: str = "stop") -> types.Completion:
    return types.Completion(token_ids=[3] * n, logprobs=[-0.1] * n, text="x" * n, finish_reason=reason)


def _group(rewards: Sequence[float], *, index: int = 0, step: int = 0, lengths: Sequence[int] | None = None,
           reasons: Sequence[str] | None = None) -> types.RolloutGroup:
    lengths = lengths or [1] * len(rewards)
    reasons = list(reasons or ["stop"] * len(rewards))
    return types.RolloutGroup(prompt=types.Prompt(index=index, text="p", answer="a"), prompt_token_ids=[1, 2],
                              completions=[_completion(n, r) for n, r in zip(lengths, reasons)],
                              policy_version=0, step=step, rewards=list(rewards))


def test_overlong_shaping_changes_advantages_not_rewards() -> None:
    # rewards [1, 1, 0, 0], lengths [10, 18, 20 (truncated), 5] with L_max 20, L_cache 4:
    # shaped = [1, 0.5, -1, 0]; mean 0.125; population std sqrt((.875² + .375² + 1.125² + .125²)/4) = 0.73951
    g = _group([1, 1, 0, 0], lengths=[10, 18, 20, 5], reasons=["stop", "stop", "length", "stop"])
    o = overlong.Overlong(max_tokens=20, buffer=4)
    assert overlong.shaped_rewards(g, o) == [1.0, 0.5, -1.0, 0.0]
    rows = batch.rows_of(groups=[g], scale_by_std=False, overlong=o)
    assert [r.advantage for r in rows] == pytest.approx([0.875, 0.375, -1.125, -0.125])
    assert [r.reward for r in rows] == [1.0, 1.0, 0.0, 0.0]          # mean_reward stays the verifiers'
    std = math.sqrt((0.875 ** 2 + 0.375 ** 2 + 1.125 ** 2 + 0.125 ** 2) / 4)
    scaled = batch.rows_of(groups=[g], scale_by_std=True, overlong=o)
    assert [r.advantage for r in scaled] == pytest.approx([x / (std + 1e-4) for x in (0.875, 0.375, -1.125, -0.125)])
    assert [r.advantage for r in batch.rows_of(groups=[g], scale_by_std=False)] == pytest.approx([.5, .5, -.5, -.5])


def test_overlong_from_spec_and_its_validation() -> None:
    a = algo(loss="DAPO", maxNewTokens=20, overlongBuffer={"length": 4})
    assert overlong.Overlong.from_spec(a) == overlong.Overlong(max_tokens=20, buffer=4, penalty=1.0)
    assert overlong.Overlong.from_spec(algo()) is None
    with pytest.raises(ValueError, match="overlongBuffer.length must be less than maxNewTokens"):
        algo(maxNewTokens=4, overlongBuffer={"length": 4})


# ---------------------------------------------------------------- DAPO: dynamic sampling, the pieces

def test_dynamic_sampling_defaults_on_for_dapo_only() -> None:
    assert algo(loss="DAPO").refill_rounds() == 3
    assert algo(loss="DAPO", dynamicSampling={"enabled": False}).refill_rounds() == 0
    assert algo(loss="GRPO").refill_rounds() == 0
    assert algo(loss="GSPO", dynamicSampling={"maxRounds": 5}).refill_rounds() == 5


def test_refill_indices_never_collide_and_keep_the_rank() -> None:
    lay = dynamic_sampling.Layout(prompts_per_step=3, steps=5, ranks=2)     # 15 training prompts; stride 16
    assert lay.stride == 16
    assert [lay.index(slot=7, round=r) for r in range(3)] == [7, 23, 39]
    assert all(lay.index(slot=k, round=r) % 2 == k % 2 for k in range(15) for r in range(4))
    seen = {lay.index(slot=k, round=r) for k in range(15) for r in range(4)}
    assert len(seen) == 60 and min(seen - set(range(15))) >= 15
    assert (lay.round_of(39), lay.slot_of(39)) == (2, 7) and lay.last_index(3) == 14 + 48


def test_evaluation_prompts_must_lie_above_the_refills() -> None:
    doc = {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "x"},
           "spec": {"model": {"builtin": "tiny"}, "task": {"copy": {"length": 4}},
                    "verifiers": [{"name": "a", "type": "ExactAnswer"}],
                    "algorithm": {"loss": "DAPO", "promptsPerStep": 4, "steps": 10},
                    "evaluation": {"firstIndex": 100}}}
    job = rljob.RLJob.model_validate(doc)
    # 40 training prompts, 3 rounds of stride 40: the last refill index is 39 + 120 = 159
    assert validate.problems(job) == [
        "spec.evaluation.firstIndex: Invalid value: 100: should be above 159, the last prompt index "
        "spec.algorithm.dynamicSampling may draw (maxRounds 3 refills of promptsPerStep x steps prompts): "
        "evaluation prompts must not be trained on"]
    doc["spec"]["evaluation"]["firstIndex"] = 160
    assert validate.problems(rljob.RLJob.model_validate(doc)) == []
    doc["spec"]["algorithm"]["dynamicSampling"] = {"enabled": False}
    doc["spec"]["evaluation"]["firstIndex"] = 100
    assert load.parse(doc).spec.algorithm.refill_rounds() == 0


def test_resampler_screens_zero_signal_groups_up_to_the_bound() -> None:
    rs = dynamic_sampling.Resampler(layout=dynamic_sampling.Layout(prompts_per_step=2, steps=10), max_rounds=2)
    # step 3, slot 6: round 0 all wrong -> refill 6 + 20; round 1 all right -> refill 46; round 2 all wrong: kept
    d0 = rs.screen(_group([0, 0], index=6, step=3))
    assert (d0.keep, d0.refill) == (False, 26) and rs.current(step=3, slot=6) == 26
    d1 = rs.screen(_group([1, 1], index=26, step=3))
    assert (d1.keep, d1.refill) == (False, 46)
    assert rs.screen(_group([0, 0], index=46, step=3)).keep                  # the bound: no third refill
    assert rs.screen(_group([0, 1], index=7, step=3)).keep                   # signal: kept at once
    assert not rs.screen(_group([0, 0], index=6, step=3)).keep                # a superseded round: dropped
    trained, c = rs.finish(step=3, groups=[_group([0, 0], index=46, step=3), _group([0, 1], index=7, step=3)])
    assert [g.prompt.index for g in trained] == [7]                          # the unfilled slot is kept out
    assert (c.resampled, c.unfilled, c.rounds) == (2, 1, 2)
    assert (c.screened_reward, c.screened_completions) == (2.0, 6)            # [0,0] + [1,1] + unfilled [0,0]
    # a rank with no signal at all trains on what it has
    trained, c = rs.finish(step=4, groups=[_group([1, 1], index=8, step=4)])
    assert len(trained) == 1 and c.unfilled == 1 and c.screened_completions == 0


# ---------------------------------------------------------------- DAPO: dynamic sampling in the trainer loop


class Inbox:
    """The trainer's data socket, fed by the fake generators."""

    def __init__(self) -> None:
        self.queue: collections.deque[wire.Message] = collections.deque()

    def recv(self, timeout: float | None = None) -> wire.Message | None:
        return self.queue.popleft() if self.queue else None


class Generators:
    """Fake generators + verifier: every prompt of a Work comes back at once as a SCORED group whose rewards are
    ``rewards(index)`` (the fake source of groups). Counts the prompts asked for."""

    def __init__(self, inbox: Inbox, rewards: Callable[[int], list[float]]) -> None:
        self.inbox, self.rewards = inbox, rewards
        self.asked: list[tuple[int, int]] = []          # (step, prompt index)
        self.peers = 1

    def send(self, msg: wire.Message, *, to: int | None = None, timeout: float | None = None) -> None:
        assert isinstance(msg, wire.Work)
        for p in msg.prompts:
            self.asked.append((msg.step, p.index))
            self.inbox.queue.append(wire.Scored(group=_group(self.rewards(p.index), index=p.index, step=msg.step)))


class Learner:
    def __init__(self) -> None:
        self.step = self.policy_version = 0
        self.trained: list[tuple[list[int], dynamic_sampling.StepCounts | None]] = []

    def train_step(self, *, groups: Sequence[types.RolloutGroup],
                   sampling: dynamic_sampling.StepCounts | None = None) -> dict[str, Any]:
        self.trained.append(([g.prompt.index for g in groups], sampling))
        self.step += 1
        self.policy_version += 1
        return {"step": self.step, "policy_version": self.policy_version}

    def resume(self, *, directory: str) -> None:
        return None

    def save_checkpoint(self, **_: Any) -> None: ...
    def follow_sync(self) -> None: ...
    def export(self, *, directory: str) -> None: ...


class Observer:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self.drops: list[str] = []

    def trained(self, *, record: Any) -> None:
        self.records.append(record)

    def dropped(self, *, reason: str) -> None:
        self.drops.append(reason)

    def unexpected(self, *, kind: str) -> None:
        raise AssertionError(kind)


def run_rank1(*, steps: int, prompts_per_step: int, rounds: int, rewards: Callable[[int], list[float]]
              ) -> tuple[Learner, Generators, Observer]:
    """Trainer rank 1 of 2 (no rank-0 parts: its round-0 groups arrive as rank 0 would have handed them out),
    with dynamic sampling of ``rounds`` refills."""
    inbox = Inbox()
    gens = Generators(inbox, rewards)
    for s in range(steps):
        for k in trainer_role.prompt_indices(step=s, prompts_per_step=prompts_per_step):
            if k % 2 == 1:
                inbox.queue.append(wire.Scored(group=_group(rewards(k), index=k, step=s)))
    learner, observer = Learner(), Observer()
    settings = trainer_role.Settings(rank=1, world=2, steps=steps, prompts_per_step=prompts_per_step,
                                     max_policy_lag=steps, sync_every=1, checkpoint_every=1000,
                                     checkpoint_dir="/nonexistent", checkpoint_keep=1, deadline=5.0,
                                     reissue_after=5.0, refill_rounds=rounds)
    trainer_role.Loop(settings=settings, inbox=inbox, generators=gens, learner=learner,  # type: ignore[arg-type]
                      prompt_at=lambda k: types.Prompt(index=k, text=f"p{k}", answer="a"),
                      observer=observer).run()
    return learner, gens, observer


def test_loop_refills_zero_signal_slots_with_new_prompts_until_the_step_has_signal() -> None:
    # 2 steps x 8 prompts, rank 1 owns the odd slots (4 per step); stride 16. Slot k's round r (index k + 16 r)
    # has signal from round (k // 2) % 3 on: step 0: slots 1, 7 at once, 3 after 1 refill, 5 after 2;
    # step 1: 13 at once, 9 and 15 after 1 refill, 11 after 2
    def rewards(index: int) -> list[float]:
        slot, r = index % 16, index // 16
        return [0.0, 1.0] if r >= (slot // 2) % 3 else [0.0, 0.0]

    learner, gens, obs = run_rank1(steps=2, prompts_per_step=8, rounds=3, rewards=rewards)
    assert sorted(gens.asked) == [(0, 19), (0, 21), (0, 37), (1, 25), (1, 27), (1, 31), (1, 43)]
    (trained0, c0), (trained1, c1) = learner.trained
    assert sorted(trained0) == [1, 7, 19, 37] and sorted(trained1) == [13, 25, 31, 43]
    assert c0 is not None and (c0.resampled, c0.unfilled, c0.rounds) == (3, 0, 2)
    assert c1 is not None and (c1.resampled, c1.unfilled, c1.rounds) == (4, 0, 2)
    assert obs.drops == []                      # screened groups are not buffer drops


def test_loop_bound_holds_and_an_unfilled_step_trains_on_what_there_is() -> None:
    # every group of slot 3 (any round) is all-wrong: at most maxRounds = 2 refills of it, then the step trains on
    # the other slots; step 0's slots 1, 5, 7 have signal
    def rewards(index: int) -> list[float]:
        return [0.0, 0.0] if index % 8 == 3 else [1.0, 0.0]        # stride 8 (one step of 8 prompts)

    learner, gens, _ = run_rank1(steps=1, prompts_per_step=8, rounds=2, rewards=rewards)
    assert gens.asked == [(0, 3 + 8), (0, 3 + 16)]
    (trained, c), = learner.trained
    assert sorted(trained) == [1, 5, 7]
    assert c is not None and (c.resampled, c.unfilled, c.rounds) == (2, 1, 2)
    assert c.screened_completions == 6                                       # 3 all-wrong groups of 2


def test_loop_all_zero_signal_rank_still_steps() -> None:
    learner, gens, _ = run_rank1(steps=2, prompts_per_step=4, rounds=1, rewards=lambda k: [1.0, 1.0])
    assert len(gens.asked) == 4 and len(learner.trained) == 2                 # 2 slots x 1 refill per step
    for trained, c in learner.trained:
        assert len(trained) == 2 and c is not None and (c.resampled, c.unfilled, c.rounds) == (2, 2, 1)


def test_train_step_counts_screened_groups_in_the_reward_and_the_record() -> None:
    from kubeforge.runtime import models
    from kubeforge.runtime.learner import step

    spec = algo(loss="DAPO", maxNewTokens=4, learningRate=1e-3)
    learner = step.Trainer(model_path=models.resolve(rljob.ModelSpec(builtin="tiny")), algorithm=spec)
    g = _group([1.0, 0.0, 0.0, 0.0], lengths=[2, 3, 1, 2])                      # trained: reward sum 1 of 4
    counts = dynamic_sampling.StepCounts(resampled=2, unfilled=1, rounds=3, screened_reward=4.0,
                                         screened_completions=6)               # dropped: reward sum 4 of 6
    m = learner.train_step(groups=[g], sampling=counts)
    assert m.mean_reward == pytest.approx(5 / 10) and m.completions == 4 and m.groups == 1
    assert (m.resampled_groups, m.unfilled_groups, m.resample_rounds) == (2, 1, 3)
    plain = learner.train_step(groups=[g])
    assert plain.mean_reward == pytest.approx(0.25) and plain.resampled_groups == 0
