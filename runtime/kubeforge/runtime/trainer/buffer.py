"""The trainer rank's rollout buffer: scored groups wait here, by step, until their step is trained.

Role: between the trainer's data socket and ``step.Trainer.train_step``. Neighbours: the trainer role loop
(``trainer/loop.py``) calls :meth:`RolloutBuffer.add` for every scored group it receives,
:meth:`RolloutBuffer.ready` / :meth:`RolloutBuffer.take` to get step ``s``'s share, and
:meth:`RolloutBuffer.drain_reissue` to learn which prompts the data cursor (trainer rank 0) must hand out again.

Invariants:
- A group is dropped, never trained on, when ``policy_version - group.policy_version > max_policy_lag`` (stale),
  checked on ``add`` and again on ``take`` (the policy may have moved on while it waited).
- Every drop is counted by reason (``drops``): stale, late (its step was already trained), duplicate (same step and
  prompt already buffered), overflow (buffer full), malformed (no rewards, or counts that disagree), and an
  infrastructure loss (``infra.ENDS``: an episode's environment server was lost): never trained on, whatever its
  rewards say; also counted in ``masked`` until the step's record takes it (:meth:`RolloutBuffer.drain_masked`).
- A dropped group's prompt is queued for re-issue iff its step is still to be trained and the buffer holds no other
  group for that (step, prompt): so a step never waits forever, and no prompt is trained twice in a step.
- At most ``capacity`` groups are held (rank 0 bounds outstanding work to ``maxPolicyLag + 1`` steps, so overflow
  means a misbehaving peer).
- ``lag_counts`` histograms the policy lag of the groups handed to training (the "policy age" metric).
"""
from __future__ import annotations

import collections
import dataclasses

from kubeforge.runtime import infra, types

STALE = "stale"
LATE = "late"
DUPLICATE = "duplicate"
OVERFLOW = "overflow"
MALFORMED = "malformed"
REASONS = (STALE, LATE, DUPLICATE, OVERFLOW, MALFORMED, *infra.ENDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reissue:
    """A prompt whose group was dropped but is still needed for ``step``."""

    step: int
    prompt: types.Prompt


def _malformed(group: types.RolloutGroup) -> bool:
    if group.rewards is None or not group.completions or len(group.rewards) != len(group.completions):
        return True
    return any(len(c.token_ids) != len(c.logprobs) for c in group.completions)


class RolloutBuffer:
    """Scored groups by step, with staleness and size bounds (see module docstring)."""

    def __init__(self, *, max_policy_lag: int, capacity: int) -> None:
        if max_policy_lag < 0 or capacity < 1:
            raise ValueError("max_policy_lag must be >= 0 and capacity >= 1")
        self.max_policy_lag = max_policy_lag
        self.capacity = capacity
        self.next_step = 0                      # the first step not yet trained
        self.drops: collections.Counter[str] = collections.Counter()     # every drop since the buffer was made
        self._drops_reported: collections.Counter[str] = collections.Counter()  # ... as of the last drain_drops
        self.masked = 0                         # groups kept out for an infrastructure loss, since drain_masked
        self.lag_counts: collections.Counter[int] = collections.Counter()
        self._by_step: dict[int, dict[int, types.RolloutGroup]] = {}
        self._reissue: list[Reissue] = []
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def holds(self, *, step: int, index: int) -> bool:
        """Is the group of prompt ``index`` for ``step`` buffered?"""
        return index in self._by_step.get(step, {})

    def count(self, *, step: int) -> int:
        """Groups buffered for ``step``."""
        return len(self._by_step.get(step, {}))

    def add(self, *, group: types.RolloutGroup, policy_version: int) -> str | None:
        """Buffer ``group``; returns the drop reason, or None when it was kept."""
        reason = self._reject_reason(group, policy_version)
        if reason is not None:
            self._drop(group, reason)
            return reason
        self._by_step.setdefault(group.step, {})[group.prompt.index] = group
        self._size += 1
        return None

    def ready(self, *, step: int, expected: int, policy_version: int) -> bool:
        """True when ``expected`` fresh groups of ``step`` are buffered (this rank's share). Evicts groups that have
        gone stale under ``policy_version`` first, queueing their prompts for re-issue."""
        self.evict_stale(policy_version=policy_version)
        return self.count(step=step) >= expected

    def evict_stale(self, *, policy_version: int) -> int:
        """Drop every buffered group that is now stale; returns how many."""
        evicted = 0
        for s in list(self._by_step):
            held = self._by_step[s]
            for index in [i for i, g in held.items() if policy_version - g.policy_version > self.max_policy_lag]:
                self._drop(held.pop(index), STALE)
                self._size -= 1
                evicted += 1
        return evicted

    def take(self, *, step: int, policy_version: int) -> list[types.RolloutGroup]:
        """Remove and return ``step``'s groups, ordered by prompt index, and mark every step <= ``step`` trained.
        Call after :meth:`ready` with the same ``policy_version``: then none is stale (any that is, is dropped
        and counted; it is not re-issued because its step is being trained now)."""
        held = self._by_step.pop(step, {})
        self._size -= len(held)
        self.advance(next_step=step + 1)
        fresh: list[types.RolloutGroup] = []
        for index in sorted(held):
            g = held[index]
            lag = policy_version - g.policy_version
            if lag > self.max_policy_lag:
                self._drop(g, STALE)
            else:
                self.lag_counts[lag] += 1
                fresh.append(g)
        return fresh

    def advance(self, *, next_step: int) -> None:
        """Forget steps before ``next_step`` (e.g. after resuming from a checkpoint); their groups count as late."""
        self.next_step = max(self.next_step, next_step)
        for s in [s for s in self._by_step if s < self.next_step]:
            for g in self._by_step.pop(s).values():
                self._size -= 1
                self.drops[LATE] += 1
        self._reissue = [r for r in self._reissue if r.step >= self.next_step]

    def drain_reissue(self) -> list[Reissue]:
        """Prompts to hand out again (each at most once); clears the list."""
        out, self._reissue = self._reissue, []
        return out

    def _reject_reason(self, group: types.RolloutGroup, policy_version: int) -> str | None:
        if _malformed(group):
            return MALFORMED
        if group.step < self.next_step:
            return LATE
        if group.prompt.index in self._by_step.get(group.step, {}):
            return DUPLICATE
        lost = infra.reason(group)
        if lost is not None:
            return lost
        if policy_version - group.policy_version > self.max_policy_lag:
            return STALE
        if self._size >= self.capacity:
            return OVERFLOW
        return None

    def drain_masked(self) -> int:
        """Groups kept out for an infrastructure loss since the last call (the step record's figure)."""
        out, self.masked = self.masked, 0
        return out

    def drain_drops(self) -> collections.Counter[str]:
        """Drops by reason since the last call (the step record's figures: a record counts its own step's drops,
        so a run's total is their sum, across restarts too)."""
        out = self.drops - self._drops_reported
        self._drops_reported = self.drops.copy()
        return out

    def _drop(self, group: types.RolloutGroup, reason: str) -> None:
        self.drops[reason] += 1
        if reason in infra.ENDS:
            self.masked += 1
        still_needed = group.step >= self.next_step
        held = group.prompt.index in self._by_step.get(group.step, {})
        queued = any(r.step == group.step and r.prompt.index == group.prompt.index for r in self._reissue)
        if still_needed and not held and not queued:
            self._reissue.append(Reissue(step=group.step, prompt=group.prompt))
