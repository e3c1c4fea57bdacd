"""The environment's reward in an episode group's reward (``spec.environment.reward``).

- ``Environment``: the reward is the environment's (0.0 for an episode that got none: it failed or ran out of turns);
  ``spec.verifiers`` still score the transcript, their scores travel for the metrics only.
- ``Verifiers``: the verifiers' aggregated reward over the transcript, as for a single-turn completion.
- ``Both``: their sum.

The environment's reward also travels as the score ``environment`` (``validate_environment.ENV_SCORE``, a verifier
name the API reserves). Neighbours: ``score.Scorer.score_group`` calls :func:`combine` after the aggregation; a
group without episodes (single turn) passes unchanged.
"""
from __future__ import annotations

from collections.abc import Callable

from kubeforge.api import rljob, validate_environment
from kubeforge.runtime import types


def _environment(verifiers: float, env: float) -> float:
    return env


def _verifiers(verifiers: float, env: float) -> float:
    return verifiers


def _both(verifiers: float, env: float) -> float:
    return verifiers + env


MODES: dict[str, Callable[[float, float], float]] = {
    rljob.EnvironmentReward.ENVIRONMENT.value: _environment,
    rljob.EnvironmentReward.VERIFIERS.value: _verifiers,
    rljob.EnvironmentReward.BOTH.value: _both,
}


def combine(mode: str | None, group: types.RolloutGroup, rewards: list[float],
            scores: dict[str, list[float]]) -> tuple[list[float], dict[str, list[float]]]:
    if mode is None or group.episode_stats is None:
        return rewards, scores
    env = [0.0 if s.env_reward is None else float(s.env_reward) for s in group.episode_stats]
    pick = MODES[mode]
    return ([float(pick(v, e)) for v, e in zip(rewards, env)],
            {**scores, validate_environment.ENV_SCORE: env})
