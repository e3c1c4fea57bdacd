"""Fair share of one pool engine: deficit round robin over the jobs that have work queued.

Role: the pool engine's loop (``generator.pool.serve``) queues every WORK it receives here under the job whose
socket it came in on, and asks :meth:`Scheduler.next` what to sample next. Pure: no engine, no clock, no I/O.

Rule (Shreedhar & Varghese's DRR, with a job's WORK items as the packets): each job has a ``weight`` (its
``promptsPerStep x groupSize``: the completions it needs per step) and a deficit. Visiting the jobs with work queued
in round-robin order, a visit adds ``weight`` to the job's deficit and serves its head item while the deficit
covers the item's ``cost`` (its completions: ``len(prompts) x groupSize``). So over any busy period each job gets
completions in proportion to its weight (a job asking twice the samples per step gets twice the engine's work and
its steps take about as long as the others'), within one item of the exact share.

Invariants: a job with nothing queued is not in the round and takes nothing; its deficit is reset to 0 when its
queue empties (idle time is not banked: a job back from waiting for its trainer does not get a burst); items of
one job are served in the order they were queued (a step's WORK before the next step's); :meth:`remove` drops a
job and its queue at once (its STOP, or detach).
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclasses.dataclass
class _Queue(Generic[T]):
    weight: float
    items: collections.deque[tuple[T, float]] = dataclasses.field(default_factory=collections.deque)
    deficit: float = 0.0
    served: float = 0.0        # cost served so far (completions): the share this scheduler gave


class Scheduler(Generic[T]):
    """Deficit round robin over jobs (see the module docstring)."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Queue[T]] = {}
        self._round: collections.deque[str] = collections.deque()   # jobs with work queued, in visiting order
        self._visiting: str | None = None     # the job whose visit is in progress (its deficit already topped up)

    def add_job(self, job: str, *, weight: float) -> None:
        """Attach ``job`` with ``weight`` (> 0); attaching again updates the weight and keeps the queue."""
        if weight <= 0:
            raise ValueError(f"fair share: job {job!r}: weight must be > 0, got {weight}")
        if job in self._jobs:
            self._jobs[job].weight = weight
        else:
            self._jobs[job] = _Queue(weight=weight)

    def remove(self, job: str) -> list[T]:
        """Detach ``job``; returns what it still had queued (dropped)."""
        q = self._jobs.pop(job, None)
        if job in self._round:
            self._round.remove(job)
        if self._visiting == job:
            self._visiting = None
        return [item for item, _ in q.items] if q is not None else []

    def push(self, job: str, item: T, *, cost: float) -> None:
        """Queue ``item`` (``cost`` > 0: its completions) behind ``job``'s earlier ones."""
        if cost <= 0:
            raise ValueError(f"fair share: job {job!r}: cost must be > 0, got {cost}")
        q = self._jobs[job]          # KeyError: not attached (the loop attaches every job before it serves)
        if not q.items:
            self._round.append(job)
        q.items.append((item, cost))

    def queued(self, job: str) -> int:
        q = self._jobs.get(job)
        return len(q.items) if q is not None else 0

    def served(self, job: str) -> float:
        """Cost served to ``job`` so far."""
        return self._jobs[job].served

    def next(self) -> tuple[str, T] | None:
        """The next (job, item) to serve; None when no job has work queued."""
        while self._round:
            job = self._round[0]
            q = self._jobs[job]
            if self._visiting != job:            # a new visit: top the deficit up once
                q.deficit += q.weight
                self._visiting = job
            cost = q.items[0][1]
            if q.deficit >= cost:
                item, _ = q.items.popleft()
                q.deficit -= cost
                q.served += cost
                if not q.items:                  # leaves the round; idle time is not banked
                    q.deficit = 0.0
                    self._round.popleft()
                    self._visiting = None
                return job, item
            self._round.rotate(-1)               # the visit ends: the deficit carries to the next round
            self._visiting = None
        return None
