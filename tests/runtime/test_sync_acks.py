"""trainer.pusher.Pusher: a generator's negative ACK (received, then failed to load: with prefetch the collective ack
went out before the load) fails the push like a failed collective ack, so trainer 0 re-forms the group."""
from __future__ import annotations

from typing import Any

import pytest

from kubeforge.runtime import transport, weightsync, wire
from kubeforge.runtime.trainer import pusher as sync


def _pusher(name: str) -> tuple[sync.Pusher, transport.Sender, transport.Receiver]:
    inbox = transport.open_receiver(f"mem://{name}-gen")
    control = transport.open_receiver(f"mem://{name}-control")
    generators = transport.open_sender([f"mem://{name}-gen"], role="trainer", index=0, ready_timeout=5)
    acks = transport.open_sender([f"mem://{name}-control"], role="generator", index=0, ready_timeout=5)
    sender: Any = object()     # _acks never touches the weight sender
    p = sync.Pusher(generators=generators, control=control, sender=sender, tensors=lambda: [], host="h", port=1,
                    world_size=2, backend="gloo", timeout_s=5)
    inbox.close()
    return p, acks, control


def test_a_negative_ack_fails_the_push() -> None:
    p, acks, control = _pusher("neg-ack")
    try:
        acks.send(wire.Ack(role="generator", index=0, of=wire.Kind.SYNC, version=3, ok=False,
                           detail="weight sync v3: loading failed: boom"))
        with pytest.raises(weightsync.WeightSyncError, match="loading failed on generator 0"):
            p._acks(3)
    finally:
        acks.close()
        control.close()


def test_a_positive_ack_reports_the_generators_figures() -> None:
    p, acks, control = _pusher("pos-ack")
    try:
        acks.send(wire.Ack(role="generator", index=0, of=wire.Kind.SYNC, version=4,
                           detail=sync.ack_detail(sync.types.SyncResult(seconds=0.25, bytes=10))))
        got = p._acks(4)
        assert [(r.seconds, r.bytes) for r in got] == [(0.25, 10)]
    finally:
        acks.close()
        control.close()
