"""A generator that joins a running job: it takes the trainer's current weights before it samples, and it says it
is alive while it serves.

```
 start ─READY─▶ trainer 0 ── push of the current policy (SYNC v) ──▶ inbox ─▶ load ─▶ current
                   WORK of version > own, before that first load: skipped (trainer 0 re-issues it behind the SYNC)
 AliveBeats thread ──ACK(READY, ok, "alive") every beat──▶ trainer 0 (own socket)
```

Why the trainer and not a live peer generator (docs/recovery.md): trainer 0 already holds the current policy and the
weight-sync group every generator joins; it answers a READY from a generator it has seen before (a restart) or one
beyond the membership (a join) with a push at once (``trainer.membership``). A peer would need a second group
between vLLM workers, and its weights may lag the trainer's by up to ``weightSync.everySteps - 1`` versions.

Neighbours: ``generator.loop.run`` and ``generator.partial.run`` ask :class:`Joining` about every WORK and tell it of
every SYNC; ``generator.start`` runs :class:`AliveBeats` from the engine's READY to the end of the loop; trainer 0's
``trainer.membership`` reads the beats (a member silent for ``failurePolicy.peerSilenceSeconds`` is left out).

Invariants: a generator whose first WORK carries its own version (a job's first attempt: version 0, the base model
both sides hold) is current at once, so ``everySteps > 1`` never makes it wait for a push. Until then a WORK of a
newer version is skipped, never sampled with weights older than the trainer's: what a joined generator sends first
carries the version it was pushed. The beats go on their own socket (a socket belongs to one thread) and are best
effort: a send that fails is retried at the next beat.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kubeforge.runtime import transport, wire

ALIVE = wire.ALIVE       # the detail of an alive beat (an ACK of kind READY with ok=True)
CURRENT_LINE = "kf-generator-current"    # printed once the weights are the trainer's (the recovery test reads it)


class Joining:
    """Whether this generator holds the trainer's weights yet (see the module docstring)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 on_current: Callable[[int, float], None] = lambda version, seconds: None) -> None:
        self.clock = clock
        self.on_current = on_current      # (version held, seconds since the READY), once
        self.current = False
        self.started = clock()            # the READY went out about now
        self.current_after: float | None = None   # seconds from the READY to holding the current weights
        self.skipped = 0

    def admit(self, work: wire.Work, *, version: int) -> bool:
        """False: ``work`` asks for a newer policy than this generator has ever held (skip it)."""
        if self.current:
            return True
        if work.policy_version > version:
            self.skipped += 1
            return False
        self._now_current(version)
        return True

    def loaded(self, *, version: int) -> None:
        """A SYNC of ``version`` was loaded: this generator holds what the trainer pushed."""
        if not self.current:
            self._now_current(version)

    def _now_current(self, version: int) -> None:
        self.current = True
        self.current_after = self.clock() - self.started
        self.on_current(version, self.current_after)


class AliveBeats:
    """Every ``every`` seconds, an ACK of kind READY, ``ok=True``, detail ``alive``, carrying the version held, to
    trainer 0 on a socket of this thread's own (``open_control``). Trainer 0 leaves a member out once it has been
    silent for the job's peer-silence deadline; a trainer that does not know the beat ignores it."""

    def __init__(self, *, index: int, open_control: Callable[[float], transport.Sender], every: float,
                 version: Callable[[], int] = lambda: 0) -> None:
        self.index, self.open_control, self.every, self.version = index, open_control, every, version
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"alive-beats-{index}", daemon=True)

    def start(self) -> AliveBeats:
        self._thread.start()
        return self

    def _run(self) -> None:
        control: transport.Sender | None = None
        while not self._stop.is_set():
            try:
                if control is None:
                    control = self.open_control(self.every)
                control.send(wire.Ack(role="generator", index=self.index, of=wire.Kind.READY, version=self.version(),
                                      ok=True, detail=ALIVE), timeout=self.every)
                self.sent += 1
            except transport.TransportError:
                pass                   # trainer 0 away (restarting): the next beat tries again
            self._stop.wait(self.every)
        if control is not None:
            control.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2 * self.every + 1.0)
