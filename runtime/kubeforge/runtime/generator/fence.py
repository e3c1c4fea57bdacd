"""A generator's fence on weight pushes: the highest trainer epoch seen in a SYNC; a SYNC of an older one is refused.

Role: ``generator.loop.sync`` asks :meth:`PushFence.admit` before it joins a broadcast (both loops: plain and partial
rollouts). Neighbours: trainer 0's ``Pusher`` stamps its epoch on every SYNC (``trainer_epoch``, the env contract's
``KUBEFORGE_TRAINER_EPOCH``); ``generator.start`` counts refusals in ``kubeforge_fenced_pushes_total``; the ACKs of
accepted pushes carry the count to the current trainer (``"fenced"`` in their detail). Design: docs/fencing.md.

Invariants: the highest epoch only grows (a SYNC of a newer epoch raises it: a replacement trainer takes over at
its first push); a refused SYNC is never joined and never acknowledged (the stale trainer's push times out, and the
ACK channel leads to the current trainer 0, which must not read it as its own); epoch 0 (an unfenced trainer) is
admitted only while no epoch was seen.
"""
from __future__ import annotations

from collections.abc import Callable

from kubeforge.runtime import wire


class PushFence:
    """The highest trainer epoch this generator has seen, and the SYNCs it refused."""

    def __init__(self, *, on_refused: Callable[[wire.Sync, int], None] = lambda sync, highest: None) -> None:
        self.highest = 0
        self.refused = 0
        self.on_refused = on_refused

    def admit(self, sync: wire.Sync) -> bool:
        """True when ``sync`` may be joined (its epoch is the highest seen so far, or newer)."""
        if sync.trainer_epoch < self.highest:
            self.refused += 1
            self.on_refused(sync, self.highest)
            return False
        self.highest = sync.trainer_epoch
        return True
