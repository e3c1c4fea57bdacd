"""When the trainer's loop pushes its weights, and how a push that overlaps the next step is joined.

```
 after step s (every weightSync.everySteps, not the last):
   finish the push in flight (its figures go in step s's record) ─ settle the membership (leave notices, silent
   members) ─ start this one: SYNC notices + snapshot now ─ broadcast in the background while step s+1 is
   collected and trained
 at a resume and after a change of membership: push(step) = finish + settle + a whole push, synchronously
 at the end: finish
```

Neighbours: ``trainer.loop`` calls :meth:`Pushes.push` and :meth:`Pushes.push_overlapped`; the weight pusher
(``trainer.pusher.Pusher`` in a pod, an in-process one in unit tests) implements :class:`WeightPusher`; rank 0's
``trainer.membership`` settles before every push and hears of a failed one. Ranks other than 0 follow every push
(the gathers a sharded model needs) and push nothing.

Invariants: a broken group (a generator died mid-sync) abandons the epoch and the push returns None: training goes on
and the generator's return (its READY) triggers the next push. The learner's ``complete_sync`` runs after every
push, failed or not, so the other ranks' gathers complete. A sharded model is pushed synchronously (the streaming
push keeps rank 0's memory at one bucket), as is every push by a pusher without ``start``.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from kubeforge.runtime import types


class WeightPusher(Protocol):
    def push(self, *, version: int, step: int) -> types.SyncResult:
        """Announce SYNC to every generator, broadcast the weights, wait for every ACK; raises
        ``weightsync.WeightSyncError`` (or any RuntimeError) when the group broke."""

    def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
        """Abandon the current weight-sync epoch; the next push forms a new one (over ``members`` generators when
        given). Returns the new epoch."""


class Follower(Protocol):
    """What a push needs of the learner (``step.Trainer``)."""

    policy_version: int

    def follow_sync(self) -> None:
        """A non-zero rank's part of rank 0's weight push (gathers of sharded weights); may do nothing."""


class Membership(Protocol):
    """What a push needs of rank 0's generators (``trainer.membership.Membership``)."""

    def drain(self) -> None: ...
    def check_silent(self) -> None: ...
    def push_failed(self, exc: BaseException) -> None: ...
    def pushed(self) -> None: ...


class Pushes:
    """Every rank's weight pushes: rank 0 pushes (``pusher`` and ``membership`` given), the others follow."""

    def __init__(self, *, learner: Follower, pusher: WeightPusher | None = None, membership: Membership | None = None,
                 beat: Callable[[str], None] = lambda activity: None) -> None:
        self.learner = learner
        self.pusher = pusher
        self.membership = membership
        self.beat = beat
        self.weights_at: float | None = None    # wall clock of the last whole push that reached every generator
        #                                         (synchronous or overlapped)

    def push_overlapped(self, *, step: int) -> types.SyncResult | None:
        """Rank 0: finish the push still in flight (started after the previous due step; its figures go in this
        step's record), then start this one: SYNC notices and the snapshot now, the broadcast in the background
        while the next step is collected and trained. A pusher without ``start`` pushes synchronously."""
        if self.pusher is None or not hasattr(self.pusher, "start") or getattr(self.learner, "sharded", False):
            return self.push(step=step)   # sharded: the streaming push keeps rank 0's memory at one bucket
        assert self.membership is not None
        pusher: Any = self.pusher
        previous = self.finish()
        self.membership.drain()   # as in push: leave notices and silent members shrink the group first
        self.membership.check_silent()
        self.beat("sync")
        try:
            pusher.start(version=self.learner.policy_version, step=step)
        except RuntimeError as exc:
            self.membership.push_failed(exc)
        finally:
            getattr(self.learner, "complete_sync", lambda: None)()
        return previous

    def finish(self) -> types.SyncResult | None:
        """Rank 0: join the push in flight, if any; a failed one abandons the epoch (as a failed ``push``)."""
        if self.pusher is None or not getattr(self.pusher, "in_flight", False):
            return None
        assert self.membership is not None
        try:
            result: types.SyncResult | None = getattr(self.pusher, "finish")()
            if result is not None:
                # a whole overlapped push too (the only kind most steps make): without it a trainer that kept
                # running reported no weightsAt until a synchronous push, and the operator closed a recovery's
                # breakdown at a step trained from rollouts sampled before the fault (docs/recovery.md)
                self.weights_at = time.time()
                self.membership.pushed()
            return result
        except RuntimeError as exc:
            self.membership.push_failed(exc)
            return None

    def push(self, *, step: int) -> types.SyncResult | None:
        """Push the current policy (other ranks take part in the gathers a sharded model needs); a broken group (a
        generator died mid-sync) abandons the epoch and returns None: training goes on and the generator's return
        (its READY) triggers the next push."""
        if self.pusher is None:
            self.learner.follow_sync()
            return None
        assert self.membership is not None
        self.finish()
        self.membership.drain()   # a leave notice that came meanwhile shrinks the group before any SYNC goes out
        self.membership.check_silent()    # so does a member silent since the last failed push
        self.beat("sync")
        try:
            result = self.pusher.push(version=self.learner.policy_version, step=step)
            self.weights_at = time.time()   # after a resume or a change of membership: the recovery's weights part
            self.membership.pushed()
            return result
        except RuntimeError as exc:
            self.membership.push_failed(exc)
            return None
        finally:    # the other ranks' follow_sync gathers complete even when the push did not
            getattr(self.learner, "complete_sync", lambda: None)()
