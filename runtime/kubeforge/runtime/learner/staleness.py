"""Per-token staleness of partial rollouts: which tokens the loss keeps, and the step's token-lag figures.

With ``spec.algorithm.partialRollouts`` a completion's tokens may come from several policy versions
(``types.RolloutGroup.token_versions``). The buffer drops a group only when its NEWEST tokens are too old
(``trainer.buffer``: ``policy_version - group.policy_version > maxPolicyLag``); here, per token, a token sampled
under a version below ``policy_version - maxPolicyLag`` is masked out of the loss (its mask 0: no ratio, no
gradient, not in the token count), the rest of its completion trains with the whole completion's advantage. We mask
rather than drop the group: the group's reward and its fresh tokens stay useful, and dropping would waste exactly
the long completions partial rollouts exist for. Every masked token is counted (``masked_stale_tokens``).

Neighbours: ``learner.batch.rows_of`` asks :func:`keep_masks`; ``trainer.loop`` records :func:`lag_figures` in the
step's record (``token_lag_mean``, ``old_version_token_fraction``, ``masked_stale_tokens``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from kubeforge.runtime import types


def keep_masks(groups: Sequence[types.RolloutGroup], *, min_version: int | None) -> list[np.ndarray | None]:
    """One entry per completion, group after group: None (keep every token) or a 0/1 array per token."""
    out: list[np.ndarray | None] = []
    for g in groups:
        if g.token_versions is None or min_version is None:   # one version: the buffer's group check decides
            out.extend(None for _ in g.completions)
            continue
        for i in range(len(g.completions)):
            v = types.token_versions(g, i)
            out.append(None if v.size == 0 or v.min() >= min_version else (v >= min_version).astype(np.uint8))
    return out


class LagFigures(TypedDict):
    """The step record's token-lag fields (``progress.StepRecord``: mypy checks the names where the loop puts
    them in the record, ``trainer.record``)."""

    token_lag_mean: float | None
    old_version_token_fraction: float | None
    masked_stale_tokens: int


def lag_figures(groups: Sequence[types.RolloutGroup], *, policy_version: int, max_policy_lag: int) -> LagFigures:
    """Tokens of ``groups`` by their lag behind ``policy_version`` (the version being trained): mean lag, the share
    from a version older than the group's newest (the tokens partial rollouts carried across an update), and how
    many were masked as stale."""
    tokens = lag_sum = older = masked = 0
    for g in groups:
        for i, c in enumerate(g.completions):
            n = len(c.token_ids)
            if n == 0:
                continue
            v = types.token_versions(g, i) if g.token_versions is not None else None
            if v is None:
                tokens, lag_sum = tokens + n, lag_sum + (policy_version - g.policy_version) * n
                continue
            lags = policy_version - v
            tokens += n
            lag_sum += int(lags.sum())
            older += int((v < g.policy_version).sum())
            masked += int((lags > max_policy_lag).sum())
    return {"token_lag_mean": round(lag_sum / tokens, 4) if tokens else None,
            "old_version_token_fraction": round(older / tokens, 4) if tokens else None,
            "masked_stale_tokens": masked}
