"""The step's record (``progress.StepRecord``): the learner's figures, then the loop's, the lag and episode figures.

Role: ``trainer.loop.Loop`` makes one per trained step on every rank (:func:`of`); rank 0 reports it, after
``trainer.accuracy`` and ``trainer.export_requests`` add their fields. Neighbours: the learner's step returns the
first part (``progress.StepMetrics``); ``trainer.buffer`` counts the drops (and the groups kept out for an infrastructure loss), ``learner.staleness`` the tokens' lag,
``trainer.episode_figures`` the episodes.

Invariant: every value enters by name (keywords, and ``TypedDict``s whose keys mypy checks against the record's
fields: ``init_forbid_extra`` in pyproject.toml), and pydantic validates its type; ``progress.StepRecord`` is the
one declaration of the fields.
"""
from __future__ import annotations

from collections.abc import Sequence

from kubeforge.api import progress
from kubeforge.runtime import types
from kubeforge.runtime.learner import fence, staleness
from kubeforge.runtime.trainer import buffer, episode_figures


def of(metrics: progress.StepMetrics, groups: Sequence[types.RolloutGroup], *, rollouts: buffer.RolloutBuffer,
       sync: types.SyncResult | None, at: float, train_seconds: float, wait_seconds: float, trained_version: int,
       max_policy_lag: int) -> progress.StepRecord:
    """The record of the step that trained ``groups`` (under policy version ``trained_version``) into ``metrics``;
    ``sync``: the push that completed during it, if any."""
    learned = progress.StepMetrics.model_validate(metrics)      # a double's plain mapping too (unit tests)
    drops = rollouts.drain_drops()
    loop = progress.StepRecord(
        step=learned.step, time=at, step_seconds=train_seconds, wait_seconds=wait_seconds,
        weight_sync_seconds=sync.seconds if sync else None, weight_sync_bytes=sync.bytes if sync else None,
        dropped_stale=drops.get(buffer.STALE, 0), dropped_total=sum(drops.values()),
        infra_masked_rollouts=rollouts.drain_masked(),
        policy_lag={str(k): v for k, v in sorted(rollouts.lag_counts.items())},
        **staleness.lag_figures(groups, policy_version=trained_version, max_policy_lag=max_policy_lag),
        **episode_figures.figures(groups))
    return progress.StepRecord.of(learned, loop)


def fencing(rec: progress.StepRecord, *, trainer_epoch: int, pushes: int, checkpoint_dir: str) -> None:
    """Rank 0 stamps its epoch on ``rec`` with the stale writes refused so far: the store's records (read from the
    checkpoint folder: they survive every restart) and the generators' counts ``pushes`` (docs/fencing.md)."""
    rec.trainer_epoch = trainer_epoch
    rec.fenced_pushes = pushes
    rec.fenced_checkpoints = fence.count(checkpoint_dir)
