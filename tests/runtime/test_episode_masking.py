"""Multi-turn episodes in the trainer: environment tokens are in the context but out of the loss.

- Perturbing the environment tokens' behaviour logprobs leaves every gradient identical (every loss variant, one
  batch and token-budgeted micro-batches); the same perturbation without the spans changes them (the check can
  fail).
- An episode of one policy turn (maxTurns = 1: one span over the whole completion) trains exactly as today's
  single-turn completion (``policy_spans`` None).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import _trainer_util as util
from kubeforge.runtime import types
from kubeforge.runtime.learner import step
from kubeforge.runtime.trainer import episode_figures

ENV = util.ENV   # the environment turn's tokens, between two policy turns


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return util.build_tiny(tmp_path_factory.mktemp("tiny") / "model")


def episode_groups(*, env_logprob: float | None, spans: bool = True) -> list[types.RolloutGroup]:
    """Synthetic groups whose completions are episodes: policy turn, environment turn (``ENV``), policy turn.
    ``env_logprob``: the environment tokens' behaviour logprob (None: random values, a perturbation)."""
    return util.episodes(util.synthetic_groups(step=0, prompts=3, group_size=4), env_logprob=env_logprob,
                         spans=spans)


def grads(tiny: Path, groups: list[types.RolloutGroup], *, loss: str = "GRPO",
          micro_batch_tokens: int | None = None) -> list[torch.Tensor]:
    """Every parameter's gradient of one train step on ``groups`` (taken as the optimizer steps)."""
    torch.manual_seed(0)
    t = step.Trainer(model_path=tiny, algorithm=util.algorithm(loss=loss, maxGradNorm=1e9),
                     scale=step.Scale(micro_batch_tokens=micro_batch_tokens))
    got: list[torch.Tensor] = []
    orig = t.optimizer.step

    def capture(*a: object, **k: object) -> object:
        got.extend(p.grad.detach().clone() for p in t.model.parameters() if p.grad is not None)
        return orig(*a, **k)

    t.optimizer.step = capture  # type: ignore[method-assign]
    t.train_step(groups=groups)
    assert got
    return got


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("loss", ["GRPO", "DAPO", "DrGRPO", "GSPO"])
def test_environment_tokens_give_no_gradient(tiny: Path, loss: str) -> None:
    base = grads(tiny, episode_groups(env_logprob=0.0), loss=loss)
    assert same(base, grads(tiny, episode_groups(env_logprob=None), loss=loss))
    # the same perturbation with every token a policy token moves the gradient: the spans are what mask it
    unmasked = grads(tiny, episode_groups(env_logprob=0.0, spans=False), loss=loss)
    assert not same(unmasked, grads(tiny, episode_groups(env_logprob=None, spans=False), loss=loss))
    assert not same(base, unmasked)


def test_environment_tokens_give_no_gradient_in_micro_batches(tiny: Path) -> None:
    base = grads(tiny, episode_groups(env_logprob=0.0), micro_batch_tokens=40)
    assert same(base, grads(tiny, episode_groups(env_logprob=None), micro_batch_tokens=40))


def test_one_turn_episodes_train_as_single_turn_completions(tiny: Path) -> None:
    single = util.synthetic_groups(step=0, prompts=3, group_size=4)
    episodes = [dataclasses.replace(g, policy_spans=tuple(((0, len(c.token_ids)),) for c in g.completions),
                                    episode_stats=tuple(types.EpisodeStats(turns=1) for _ in g.completions))
                for g in util.synthetic_groups(step=0, prompts=3, group_size=4)]
    assert same(grads(tiny, single), grads(tiny, episodes))


def test_episode_figures() -> None:
    fig = episode_figures.figures(episode_groups(env_logprob=0.0))
    assert fig["episode_turns_mean"] == 2.0 and fig["tool_calls"] == 12
    assert fig["env_masked_tokens"] == 12 * len(ENV)
    assert episode_figures.figures(util.synthetic_groups(step=0, prompts=1, group_size=2)) == {}
