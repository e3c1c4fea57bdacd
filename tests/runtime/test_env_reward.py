"""spec.environment.reward: how the environment's reward and the verifiers' become an episode group's reward."""
from __future__ import annotations

import pytest

from kubeforge.runtime import types
from kubeforge.runtime.launcher import summary
from kubeforge.runtime.verifiers import env_reward


def group(stats: tuple[types.EpisodeStats, ...] | None) -> types.RolloutGroup:
    comps = [types.Completion(token_ids=[1], logprobs=[-1.0], text="x") for _ in range(2)]
    return types.RolloutGroup(prompt=types.Prompt(index=0, text="", answer=""), prompt_token_ids=[1],
                              completions=comps, policy_version=0, episode_stats=stats)


@pytest.mark.parametrize("mode,want", [("Environment", [1.0, 0.0]), ("Verifiers", [0.5, 0.25]),
                                       ("Both", [1.5, 0.25])])
def test_modes(mode: str, want: list[float]) -> None:
    g = group((types.EpisodeStats(turns=1, env_reward=1.0), types.EpisodeStats(turns=2, env_reward=None)))
    rewards, scores = env_reward.combine(mode, g, [0.5, 0.25], {"answer": [0.5, 0.25]})
    assert rewards == want
    assert scores == {"answer": [0.5, 0.25], "environment": [1.0, 0.0]}


def test_single_turn_groups_pass_unchanged() -> None:
    assert env_reward.combine("Environment", group(None), [0.5, 0.25], {}) == ([0.5, 0.25], {})
    assert env_reward.combine(None, group((types.EpisodeStats(turns=1, env_reward=1.0),) * 2), [0.5, 0.25], {}) \
        == ([0.5, 0.25], {})


def test_summary_has_the_episode_figures() -> None:
    from kubeforge.api import progress

    recs = [progress.StepRecord(step=s, policy_version=s, mean_reward=0.5, episode_turns_mean=t, tool_calls=c,
                                tool_errors=1, env_masked_tokens=10) for s, t, c in [(1, 2.0, 3), (2, 1.0, 5)]]
    out = summary.summarize(recs, wall_seconds=1.0, metrics_path="m")
    assert (out["episode_turns_mean"], out["tool_calls_total"], out["tool_errors_total"],
            out["env_masked_tokens"]) == (1.5, 8, 2, 20)
    plain = summary.summarize([progress.StepRecord(step=1, policy_version=1)], wall_seconds=1.0, metrics_path="m")
    assert plain["episode_turns_mean"] is None and plain["tool_calls_total"] == 0
