"""The step's episode figures (``spec.environment``): turns, tool calls and errors, masked environment tokens.

Neighbours: ``trainer.loop`` adds :func:`figures` to the step's record (``progress.StepRecord``); ``learner.batch``
masks the environment tokens these count (``types.policy_mask``); the launcher's summary and the metrics read them.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

from kubeforge.runtime import types


class EpisodeFigures(TypedDict, total=False):
    """The step record's episode fields (``progress.StepRecord``: mypy checks the names where the loop puts them
    in the record, ``trainer.record``); none for single-turn groups."""

    episode_turns_mean: float | None
    tool_calls: int
    tool_errors: int
    env_masked_tokens: int


def figures(groups: Sequence[types.RolloutGroup]) -> EpisodeFigures:
    """Sums over the episodes of ``groups`` (empty when none is an episode group: single-turn records unchanged)."""
    turns: list[int] = []
    calls = errors = masked = 0
    for g in groups:
        if g.episode_stats is not None:
            for st in g.episode_stats:
                turns.append(st.turns)
                calls += st.tool_calls
                errors += st.tool_errors
        if g.policy_spans is not None:
            for c, spans in zip(g.completions, g.policy_spans):
                masked += len(c.token_ids) - sum(e - s for s, e in spans)
    if not turns and not masked:
        return {}
    return {"episode_turns_mean": round(sum(turns) / len(turns), 4) if turns else None, "tool_calls": calls,
            "tool_errors": errors, "env_masked_tokens": masked}
