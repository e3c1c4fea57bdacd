"""Trainer rank 0's ear for its generators: when each was last heard, and which went silent for too long.

```
 control inbox ── any message of generator g (READY, ACK, alive beat) ──▶ heard(g)
 Membership.check_silent ──▶ silent(members) = the generators that beat once and then said nothing for ``after`` s
```

Neighbours: ``trainer.membership`` owns one, feeds it every control message and leaves the silent ones out (their
prompts go to the live generators, the weight-sync group re-forms without them); the beats themselves are
``generator.join.AliveBeats``.

Invariants: only a generator that has sent an alive beat is judged (a generator of an older build, which never
beats, is never left out for silence); ``after`` <= 0 turns the judging off. A generator that is starting (its
engine loads) or already left out is not judged again. The clock is injected (``time.monotonic`` by default).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from kubeforge.runtime import wire


class Liveness:
    """When each generator was last heard (see the module docstring)."""

    def __init__(self, *, after: Callable[[], float], clock: Callable[[], float] = time.monotonic) -> None:
        self.after = after                # seconds of silence that leave a generator out (read at each use)
        self.clock = clock
        self.last: dict[int, float] = {}
        self.beating: set[int] = set()

    def heard(self, msg: wire.Message) -> None:
        """A control message; those of a generator count as a sign of life."""
        if isinstance(msg, (wire.Ready, wire.Ack)) and msg.role == "generator":
            self.last[msg.index] = self.clock()
            if isinstance(msg, wire.Ack) and msg.of == wire.Kind.READY and msg.ok \
                    and msg.detail == wire.ALIVE:
                self.beating.add(msg.index)

    def silent(self, candidates: Iterable[int]) -> set[int]:
        """The candidates that beat once and have not been heard for ``after`` seconds."""
        after = self.after()
        if after <= 0:
            return set()
        now = self.clock()
        return {g for g in candidates if g in self.beating and now - self.last.get(g, now) > after}

    def since(self, candidates: Iterable[int], *, wall: Callable[[], float] = time.time) -> dict[int, float]:
        """The :meth:`silent` candidates, each with the wall clock when it was last heard (what trainer 0 reports
        to the operator: docs/recovery.md)."""
        now, at = self.clock(), wall()
        return {g: at - (now - self.last[g]) for g in sorted(self.silent(candidates))}

    def quiet_for(self, g: int) -> float:
        """Seconds since generator ``g`` was last heard (0 when never)."""
        return self.clock() - self.last[g] if g in self.last else 0.0
