"""``Pushes.weights_at``: the wall clock of the last whole push, overlapped or synchronous (docs/recovery.md: the
operator's recovery breakdown closes at the first step trained after a whole push made since the detection; a trainer
whose overlapped pushes left it unset reported none, and the operator closed the 2026-11-30 breakdown at a step
trained from rollouts sampled before the fault)."""
from __future__ import annotations

import time

import pytest
from kubeforge.runtime import types
from kubeforge.runtime.trainer import pushes


class Learner:
    policy_version = 3

    def follow_sync(self) -> None:
        pass


class Membership:
    def __init__(self) -> None:
        self.pushed_n, self.failed = 0, 0

    def drain(self) -> None:
        pass

    def check_silent(self) -> None:
        pass

    def push_failed(self, exc: BaseException) -> None:
        self.failed += 1

    def pushed(self) -> None:
        self.pushed_n += 1


class OverlapPusher:
    """Starts a push, finishes it at the next call (``fail``: the group broke meanwhile)."""

    def __init__(self) -> None:
        self.in_flight, self.fail = False, False

    def start(self, *, version: int, step: int) -> None:
        self.in_flight = True

    def finish(self) -> types.SyncResult | None:
        self.in_flight = False
        if self.fail:
            raise RuntimeError("generator-0 left the broadcast")
        return types.SyncResult(seconds=0.1, bytes=10)

    def push(self, *, version: int, step: int) -> types.SyncResult:
        return types.SyncResult(seconds=0.1, bytes=10)

    def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
        return 1


def test_a_whole_overlapped_push_sets_weights_at_and_a_broken_one_does_not() -> None:
    pusher, members = OverlapPusher(), Membership()
    p = pushes.Pushes(learner=Learner(), pusher=pusher, membership=members)
    before = time.time()
    assert p.push_overlapped(step=1) is None and p.weights_at is None, "started, not finished: nothing reached"
    assert p.push_overlapped(step=2) is not None, "the first push finished"
    assert p.weights_at is not None and before <= p.weights_at <= time.time() and members.pushed_n == 1
    first = p.weights_at
    pusher.fail = True
    assert p.push_overlapped(step=3) is None and members.failed == 1
    assert p.weights_at == first, "a push the group broke reached nobody for sure"


def test_a_synchronous_push_still_sets_it() -> None:
    p = pushes.Pushes(learner=Learner(), pusher=OverlapPusher(), membership=Membership())
    p.push(step=1)
    assert p.weights_at == pytest.approx(time.time(), abs=5.0)
