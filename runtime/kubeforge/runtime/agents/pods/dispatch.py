"""The generator's hand-out of episodes to agent pods: a queue of offered episodes, claims with leases, ends.

```
 sampler.run_group ─ offer(id, task) ─▶ waiting ─ claim (agent pod, long poll) ─▶ claimed ─ done(exit) ─▶ ended
                                          │ no claim in claim_seconds            │ no heartbeat in lease_seconds
                                          ▼                                      │ or past episode_seconds + grace
                                       ended agent_lost                          ▼ ended agent_lost / env_timeout
 sampler.run_group ◀─ wait(ids) ─ every id ended (a bounded wait: each state above has its own bound)
```

Invariants:
- An episode ends once; its finish reason is ``stop`` (the program exited 0), ``env_error`` (non-zero exit),
  ``env_timeout`` (past its time: the agent pod's worker killed it, or it never reported), or ``agent_lost``
  (``infra.AGENT_LOST``: not claimed in ``claim_seconds``, or its agent pod stopped its heartbeats for
  ``lease_seconds``: the pod died or was cut off). An ``agent_lost`` group is never scored nor trained on
  (``runtime/infra.py``): a dead pod is not the policy's fault.
- Every wait is bounded and takes an injected clock (``clock``, ``Condition.wait`` timeouts), so tests drive time.
- A claim hands out the episode's own credential (``endpoint.server.episode_key``), never the job key.
Thread-safe: the endpoint's HTTP threads claim, beat and end; the generator's loop thread offers and waits.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kubeforge.runtime import infra

CLAIM_SECONDS = 120.0     # an offered episode waits this long for an agent pod (pods start beside the generators)
LEASE_SECONDS = 20.0      # a claimed episode whose agent pod sent nothing for this long is lost (loaded CPUs)
HEARTBEAT_SECONDS = 2.0   # how often an agent pod beats for each episode it runs (worker.py)
GRACE_SECONDS = 10.0      # past the episode's time: the worker kills its program first, then reports
MAX_WAIT_SECONDS = 20.0   # the longest long poll of a claim
STOP, ERROR, TIMEOUT, LOST = "stop", "env_error", "env_timeout", infra.AGENT_LOST


@dataclasses.dataclass(kw_only=True)
class _Item:
    episode_id: str
    task: dict[str, Any]
    offered: float
    claimed: float | None = None
    beat: float | None = None
    ended: str | None = None
    exit_code: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Claim:
    """What a claim hands an agent pod: the episode, its task and how long it may run."""

    episode_id: str
    task: dict[str, Any]
    seconds: float


class Dispatch:
    """Offered, claimed and ended episodes of one generator (see the module docstring)."""

    def __init__(self, *, episode_seconds: float, claim_seconds: float = CLAIM_SECONDS,
                 lease_seconds: float = LEASE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.episode_seconds, self.claim_seconds, self.lease_seconds = episode_seconds, claim_seconds, lease_seconds
        self.clock = clock
        self._items: dict[str, _Item] = {}
        self._waiting: collections.deque[str] = collections.deque()
        self._cond = threading.Condition()
        self.ends: collections.Counter[str] = collections.Counter()   # by finish reason, since the start

    def offer(self, episode_id: str, task: dict[str, Any]) -> None:
        with self._cond:
            self._items[episode_id] = _Item(episode_id=episode_id, task=task, offered=self.clock())
            self._waiting.append(episode_id)
            self._cond.notify_all()

    def claim(self, *, wait: float) -> Claim | None:
        """The oldest waiting episode, claimed now; None when none came within ``wait`` seconds (at most
        ``MAX_WAIT_SECONDS``)."""
        deadline = self.clock() + min(max(wait, 0.0), MAX_WAIT_SECONDS)
        with self._cond:
            while True:
                self._expire()
                while self._waiting:
                    item = self._items.get(self._waiting.popleft())
                    if item is not None and item.ended is None:
                        item.claimed = item.beat = self.clock()
                        return Claim(episode_id=item.episode_id, task=item.task, seconds=self.episode_seconds)
                left = deadline - self.clock()
                if left <= 0:
                    return None
                self._cond.wait(timeout=min(left, 1.0))

    def beat(self, episode_id: str) -> bool:
        """An agent pod still runs ``episode_id``; False when the episode ended (the pod should stop its program)."""
        with self._cond:
            self._expire()
            item = self._items.get(episode_id)
            if item is None or item.ended is not None or item.claimed is None:
                return False
            item.beat = self.clock()
            return True

    def touch(self, episode_id: str) -> None:
        """A model call of the episode arrived: as good as a heartbeat."""
        self.beat(episode_id)

    def done(self, episode_id: str, *, exit_code: int, timed_out: bool) -> bool:
        """The agent pod's program for ``episode_id`` ended; False when the episode had ended already."""
        reason = TIMEOUT if timed_out else STOP if exit_code == 0 else ERROR
        with self._cond:
            item = self._items.get(episode_id)
            if item is None or item.ended is not None or item.claimed is None:
                return False
            item.exit_code = exit_code
            self._end(item, reason)
            return True

    def wait(self, episode_ids: Sequence[str]) -> dict[str, str]:
        """Block until every episode of ``episode_ids`` ended (each state has its bound: see the module
        docstring); their finish reasons. The episodes are forgotten."""
        with self._cond:
            while True:
                self._expire()
                if all(self._items[e].ended is not None for e in episode_ids):
                    return {e: str(self._items.pop(e).ended) for e in episode_ids}
                self._cond.wait(timeout=0.5)

    def pending(self) -> int:
        with self._cond:
            return sum(1 for i in self._items.values() if i.ended is None)

    def _expire(self) -> None:
        now = self.clock()
        for item in self._items.values():
            if item.ended is not None:
                continue
            if item.claimed is None and now - item.offered > self.claim_seconds:
                self._end(item, LOST)
            elif item.beat is not None and now - item.beat > self.lease_seconds:
                self._end(item, LOST)
            elif item.claimed is not None and now - item.claimed > self.episode_seconds + GRACE_SECONDS:
                self._end(item, TIMEOUT)

    def _end(self, item: _Item, reason: str) -> None:
        item.ended = reason
        self.ends[reason] += 1
        self._cond.notify_all()
