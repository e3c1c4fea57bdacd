"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.3): a group whose rewards are all equal
(every completion right, or every one wrong) has advantage 0 everywhere, so it adds no gradient but dilutes the
batch; such a group is dropped and a NEW prompt is sampled in its place, until the step holds ``promptsPerStep``
groups with signal or the bound is hit.

Role: the trainer role loop (``trainer/loop.py``) asks :meth:`Resampler.screen` about every scored group before
it buffers it, sends the refill prompt it names straight to a generator (as re-issues go), and hands the step's
groups through :meth:`Resampler.finish` before ``train_step``.

Slots and rounds: prompt ``k`` of step ``s`` (``k`` in ``[s*P, (s+1)*P)``, the data cursor's) is a slot. Round 0
is the slot's own prompt; a refill in round ``r >= 1`` draws prompt ``k + r * stride`` of the task stream, where
``stride`` is ``P * steps`` rounded up to a multiple of the trainer ranks: the index stays a pure function of
(step, slot, round) (a resumed job draws the same refills), never one of the training prompts of another step, and
keeps ``index % ranks`` so the verifier routes the refill to the rank that asked (``validate`` keeps evaluation
prompts above the last refill index).

The bound: a slot is refilled at most ``max_rounds`` times (``spec.algorithm.dynamicSampling.maxRounds``), so a
step waits for at most ``max_rounds`` extra generations per slot. A slot whose last round still has no signal is
"unfilled": the step trains on the groups with signal it has (fewer than P); a rank that has none at all trains on
its unfilled groups (advantage 0: no policy gradient; the step still happens on every rank). Counted per step:
``resampled_groups`` (groups dropped and replaced), ``unfilled_groups``, ``resample_rounds`` (the most refills a
slot needed); ``mean_reward`` covers every group sampled for the step, dropped ones included, so it measures the
policy rather than the filter.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from kubeforge.runtime import types


def has_signal(group: types.RolloutGroup) -> bool:
    """Rewards that differ: a non-zero advantage somewhere in the group."""
    r = list(group.rewards or [])
    return bool(r) and max(r) != min(r)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    """Where refill prompts live in the task stream (see the module docstring)."""

    prompts_per_step: int
    steps: int
    ranks: int = 1

    @property
    def stride(self) -> int:
        n = self.prompts_per_step * self.steps
        return -(-n // self.ranks) * self.ranks

    def index(self, *, slot: int, round: int) -> int:
        """The prompt index slot ``slot`` samples in ``round`` (0: the slot's own prompt)."""
        return slot + round * self.stride

    def round_of(self, index: int) -> int:
        return index // self.stride

    def slot_of(self, index: int) -> int:
        return index % self.stride

    def last_index(self, max_rounds: int) -> int:
        """The largest index a refill may draw."""
        return self.index(slot=self.prompts_per_step * self.steps - 1, round=max_rounds)


@dataclasses.dataclass(kw_only=True)
class StepCounts:
    """One step's dynamic-sampling figures on one rank (``train_step`` sums them over ranks)."""

    resampled: int = 0              # zero-signal groups dropped and replaced by a new prompt
    unfilled: int = 0               # slots still without signal after max_rounds refills
    rounds: int = 0                 # the most refills any slot of the step needed
    screened_reward: float = 0.0    # sum of the rewards of groups kept out of the loss
    screened_completions: int = 0   # their completions

    def screen_out(self, group: types.RolloutGroup) -> None:
        self.screened_reward += float(sum(group.rewards or []))
        self.screened_completions += len(group.completions)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decision:
    keep: bool                      # buffer the group
    refill: int | None = None       # prompt index to sample in its place (when dropped)


KEEP = Decision(keep=True)


class Resampler:
    """Per-slot refill rounds of the steps in flight on one trainer rank (see the module docstring)."""

    def __init__(self, *, layout: Layout, max_rounds: int) -> None:
        if max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")
        self.layout = layout
        self.max_rounds = max_rounds
        self._round: dict[tuple[int, int], int] = {}      # (step, slot) -> the round now awaited
        self._counts: dict[int, StepCounts] = {}

    def counts(self, step: int) -> StepCounts:
        return self._counts.setdefault(step, StepCounts())

    def current(self, *, step: int, slot: int) -> int:
        """The prompt index slot ``slot`` of ``step`` now waits for (to re-issue it when it does not arrive)."""
        return self.layout.index(slot=slot, round=self._round.get((step, slot), 0))

    def screen(self, group: types.RolloutGroup) -> Decision:
        """Keep a group with signal, or one of a slot's last round; drop one without signal and name the refill.
        A group of a round its slot has moved past (a duplicate) is dropped with no refill."""
        step, index = group.step, group.prompt.index
        k, slot = self.layout.round_of(index), self.layout.slot_of(index)
        awaited = self._round.get((step, slot), 0)
        if has_signal(group):
            return KEEP if k >= awaited else Decision(keep=False)
        if k < awaited:
            return Decision(keep=False)
        if k >= self.max_rounds:
            return KEEP                # the bound: finish() keeps it out of the loss if the rank has better
        c = self.counts(step)
        c.resampled += 1
        c.screen_out(group)
        c.rounds = max(c.rounds, k + 1)
        self._round[(step, slot)] = k + 1
        return Decision(keep=False, refill=self.layout.index(slot=slot, round=k + 1))

    def finish(self, *, step: int, groups: Sequence[types.RolloutGroup]
               ) -> tuple[list[types.RolloutGroup], StepCounts]:
        """The groups ``step`` trains on and its counts; forgets the step. Unfilled groups (no signal after the
        last round) are kept out unless this rank has no group with signal."""
        c = self._counts.pop(step, StepCounts())
        for key in [key for key in self._round if key[0] <= step]:
            del self._round[key]
        for old in [s for s in self._counts if s < step]:
            del self._counts[old]
        signal = [g for g in groups if has_signal(g)]
        unfilled = [g for g in groups if not has_signal(g)]
        c.unfilled = len(unfilled)
        if not signal:
            return list(groups), c
        for g in unfilled:
            c.screen_out(g)
        return signal, c
