"""A generator joins only the weight-sync group of trainer 0 as its env contract names it: a SYNC naming any other
address (a forged frame, an address taken from the wire) is refused, counted, never joined and never acked."""
from __future__ import annotations

import threading
import uuid

from kubeforge.runtime import transport, wire
from kubeforge.runtime.generator import loop as generator_role

TRAINER_WEIGHTS = ("job-trainer-0.job.ns.svc", 29504)


class Weights:
    def __init__(self) -> None:
        self.loaded: list[wire.Sync] = []

    def load(self, sync: wire.Sync) -> generator_role.SyncResult:
        self.loaded.append(sync)
        return generator_role.SyncResult(seconds=0.0, bytes=1)


class Observer:
    def __init__(self) -> None:
        self.unexpected_kinds: list[str] = []

    def sampled(self, **_: object) -> None: ...
    def synced(self, **_: object) -> None: ...
    def sync_failed(self, **_: object) -> None: ...
    def skipped(self, **_: object) -> None: ...

    def unexpected(self, *, kind: str) -> None:
        self.unexpected_kinds.append(kind)


def _sync(host: str, port: int, version: int) -> wire.Sync:
    return wire.Sync(version=version, step=version, host=host, port=port, world_size=2)


def test_a_forged_sync_naming_a_foreign_address_is_refused() -> None:
    name = uuid.uuid4().hex
    inbox = transport.open_receiver(f"mem://gen-{name}")
    control_in = transport.open_receiver(f"mem://ctl-{name}")
    ver_in = transport.open_receiver(f"mem://ver-{name}")
    to_gen = transport.open_sender([f"mem://gen-{name}"], role="trainer", index=0)
    control = transport.open_sender([f"mem://ctl-{name}"], role="generator", index=0)
    verifiers = transport.open_sender([f"mem://ver-{name}"], role="generator", index=0)
    weights, observer = Weights(), Observer()
    try:
        to_gen.send(_sync("attacker.example", 29504, 7))                 # foreign host
        to_gen.send(_sync(TRAINER_WEIGHTS[0], 31337, 8))                 # the trainer's host, a foreign port
        to_gen.send(_sync(*TRAINER_WEIGHTS, 1))                          # the real one
        to_gen.send(wire.Stop(reason="done"))
        t = threading.Thread(target=generator_role.run, kwargs=dict(
            index=0, inbox=inbox, verifiers=verifiers, control=control, sampler=None, weights=weights,
            observer=observer, trainer_weights=TRAINER_WEIGHTS))
        t.start()
        t.join(20)
        assert not t.is_alive()
        assert [s.version for s in weights.loaded] == [1]
        assert observer.unexpected_kinds == [generator_role.FORGED_SYNC] * 2
        acks = []
        while (msg := control_in.recv(timeout=0.2)) is not None:
            acks.append(msg)
        assert [(type(m).__name__, getattr(m, "version", None)) for m in acks] == [("Ready", None), ("Ack", 1)]
    finally:
        for s in (to_gen, control, verifiers):
            s.close()
        for r in (inbox, control_in, ver_in):
            r.close()
