"""What the trainer role needs of a learner: :class:`Learner`, whose step returns the typed
``progress.StepMetrics``.

Role: the face of ``learner/`` towards the trainer role. ``trainer.loop.Loop`` is written against this Protocol;
``learner.step.Trainer`` implements it (and the unit tests' in-process doubles do). Beyond it the role asks, where
a learner has them, for ``complete_sync`` and ``sharded`` (the weight push), ``any_rank``, ``agree`` and
``saves_alone`` (a stop agreed by every rank, an export request, the stop checkpoint): one rank in one process
needs none of them.

Invariant: every rank calls :meth:`Learner.train_step` once per step (with no groups if it has none), and
:meth:`Learner.save_checkpoint`, :meth:`Learner.follow_sync` and :meth:`Learner.export` at the same points: a
sharded learner's collectives need every rank.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kubeforge.api import progress
from kubeforge.runtime import types
from kubeforge.runtime.learner import dynamic_sampling


class Learner(Protocol):
    """One trainer rank's learner: its position, one step, checkpoints, its part of a weight push, the export."""

    step: int                       # optimizer steps done
    policy_version: int             # version of the weights (stamped on pushes and checkpoints)

    def train_step(self, *, groups: Sequence[types.RolloutGroup],
                   sampling: dynamic_sampling.StepCounts | None = None) -> progress.StepMetrics:
        """One optimizer step on this rank's ``groups``, averaged with every other rank; ``sampling``: dynamic
        sampling's counts of the step (every rank passes them, or none does)."""

    def resume(self, *, directory: str) -> dict[str, Any] | None:
        """Restore the newest complete checkpoint; its state (``data_cursor`` among it), or None."""

    def save_checkpoint(self, *, directory: str, keep: int, data_cursor: int,
                        extra: Mapping[str, Any] | None = None) -> Path | None:
        """Write a checkpoint of this step; the folder on rank 0."""

    def follow_sync(self) -> None:
        """A non-zero rank's part of rank 0's weight push (gathers of sharded weights); may do nothing."""

    def export(self, *, directory: str) -> Path | None:
        """Write the policy as an HF folder under ``directory`` (every rank calls it; rank 0 writes)."""
