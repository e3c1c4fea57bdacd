"""The generator loop with partial rollouts (``spec.algorithm.partialRollouts``): work joins the running batch,
weights change between two engine steps, groups leave as soon as they are complete.

```
 inbox ─ WORK ─▶ pool.add (its requests join the ones in flight; no wait for the batch to drain)
       ─ SYNC ─▶ weights.load ─▶ pool.switch(v) ─▶ ACK        (between two engine steps, requests in flight)
       ─ STOP ─▶ pool.abort, passed on to the verifiers
 while requests are in flight: pool.step() ─▶ finished groups ─▶ ROLLOUT (each token stamped with its version)
```

Neighbours: ``generator.loop`` (the whole-batch loop) dispatches here and shares its SYNC handling
(``loop.sync``), leave notice and STOP hand-over; ``generator.stepper.Pool`` holds the requests in flight.

Invariants: the inbox is polled without waiting between two steps while requests are in flight (so a SYNC waits at
most one engine step, not the longest completion), with ``loop.POLL_SECONDS`` when idle; WORK the generator's
weights are too old for (``maxPolicyLag``) is skipped as in the whole-batch loop. A group's ``policy_version`` is
the newest version any of its tokens was sampled under; ``token_versions`` tells each token's (None when all share
one). ``Activity`` counts the time the engine stepped against the wall time since the first WORK (the generator
idle fraction of ``bench/bench_partial_rollouts.py``); both loops keep one.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from kubeforge.runtime import transport, wire
from kubeforge.runtime.generator import fence as push_fence
from kubeforge.runtime.generator import join, loop, stepper


class Activity:
    """Busy (generating) seconds against the wall time since the first WORK; printed as one JSON line at the end."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.first_work: float | None = None
        self.last: float | None = None
        self.busy = 0.0
        self.sync = 0.0
        self.extra: dict[str, Any] = {}

    def work(self) -> None:
        if self.first_work is None:
            self.first_work = self.clock()

    def add_busy(self, seconds: float) -> None:
        self.busy += seconds
        self.last = self.clock()

    def add_sync(self, seconds: float) -> None:
        self.sync += seconds

    def report(self) -> dict[str, Any]:
        wall = (self.last - self.first_work) if self.first_work is not None and self.last is not None else 0.0
        return {"busy_seconds": round(self.busy, 3), "sync_seconds": round(self.sync, 3),
                "wall_seconds": round(wall, 3),
                "idle_fraction": round(max(0.0, 1.0 - self.busy / wall), 4) if wall > 0 else None, **self.extra}

    def line(self, index: int) -> str:
        return "kf-generator-activity " + json.dumps({"generator": index, **self.report()})


def run(*, index: int, inbox: transport.Receiver, verifiers: transport.Sender, control: transport.Sender,
        pool: stepper.Pool, weights: loop.WeightLoader, observer: loop.GeneratorObserver, policy_version: int = 0,
        should_stop: Callable[[], bool] = lambda: False, max_policy_lag: int | None = None,
        beat: Callable[[str], None] = lambda activity: None, trainer_weights: tuple[str, int] | None = None,
        leave: loop.LeaveNotice | None = None, seed: Callable[[int], int | None] = lambda step: None,
        synced: Callable[[], None] = lambda: None, activity: Activity | None = None,
        fence: push_fence.PushFence | None = None, joining: join.Joining | None = None) -> None:
    """Serve until STOP (or ``should_stop``); ``seed(step)`` seeds a WORK's requests, ``synced`` runs after every
    weight load (the vLLM backend's prefix-cache reset); ``joining`` as in ``loop.run``."""
    act = activity or Activity()
    fence = fence or push_fence.PushFence()
    joining = joining or join.Joining()
    version = policy_version
    if leave is not None:
        leave.version = version
    control.send(wire.Ready(role="generator", index=index, policy_version=version))
    try:
        while not should_stop():
            busy = pool.busy()
            beat("generate" if busy else "idle")
            msg = inbox.recv(timeout=0.0 if busy else loop.POLL_SECONDS)
            if isinstance(msg, wire.Stop):
                pool.abort()
                loop._pass_on(msg, verifiers)
                return
            if isinstance(msg, wire.Work):
                act.work()
                if not joining.admit(msg, version=version) or (
                        max_policy_lag is not None and msg.policy_version - version > max_policy_lag):
                    observer.skipped(work=msg, version=version)
                else:
                    pool.add(msg.prompts, step=msg.step, version=version, seed=seed(msg.step))
            elif isinstance(msg, wire.Sync):
                started = time.monotonic()
                new = loop.sync(msg, index=index, version=version, weights=weights, control=control,
                                observer=observer, beat=beat, trainer_weights=trainer_weights, leave=leave,
                                fence=fence, joining=joining)
                if new != version:
                    version = new
                    pool.switch(version)
                    synced()
                act.add_sync(time.monotonic() - started)
            elif msg is not None:
                observer.unexpected(kind=type(msg).__name__)
            if msg is not None and not busy:
                continue          # idle: take every waiting message before the first step
            if pool.busy():
                started = time.monotonic()
                groups = pool.step()
                seconds = time.monotonic() - started
                act.add_busy(seconds)
                if groups:
                    for g in groups:
                        g.generator = index
                    observer.sampled(groups=groups, seconds=seconds)
                    verifiers.send_many([wire.Rollout(group=g) for g in groups])
        if leave is not None:
            leave.send()
        else:
            loop._leave(control, index=index, version=version)
    finally:
        act.extra.update(switches=pool.counters.switches, switched_completions=pool.counters.switched_completions,
                         completions=pool.counters.completions, tokens=pool.counters.tokens)
        print(act.line(index), flush=True)
