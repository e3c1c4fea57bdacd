"""Weight pushes are fenced by trainer epoch (docs/fencing.md): a generator refuses a SYNC from an epoch older than
the highest it has seen (never joined, never acked, counted), a newer epoch takes over at its first push, and the
current trainer 0 learns the count from the ACKs of its own pushes. The generator's real loop and trainer 0's real
Pusher over the in-process transport; only the broadcast itself (the weight sender and loader) is a double."""
from __future__ import annotations

import dataclasses
import threading
import uuid
from typing import Any

import pytest

from kubeforge.runtime import transport, weightsync, wire
from kubeforge.runtime.generator import fence as push_fence
from kubeforge.runtime.generator import loop as generator_role
from kubeforge.runtime.trainer import pusher as trainer_push

WEIGHTS = ("job-trainer-0.job.ns.svc", 29504)


class Weights:
    def __init__(self) -> None:
        self.loaded: list[tuple[int, int]] = []      # (trainer epoch, version)

    def load(self, sync: wire.Sync) -> generator_role.SyncResult:
        self.loaded.append((sync.trainer_epoch, sync.version))
        return generator_role.SyncResult(seconds=0.01, bytes=8)


class Observer:
    def sampled(self, **_: object) -> None: ...
    def synced(self, **_: object) -> None: ...
    def sync_failed(self, **_: object) -> None: ...
    def skipped(self, **_: object) -> None: ...
    def unexpected(self, **_: object) -> None: ...


def sync(epoch: int, version: int) -> wire.Sync:
    return wire.Sync(version=version, step=version, host=WEIGHTS[0], port=WEIGHTS[1], world_size=2,
                     trainer_epoch=epoch)


def test_the_fence_keeps_the_highest_epoch_and_counts_what_it_refuses() -> None:
    refused: list[tuple[int, int]] = []
    f = push_fence.PushFence(on_refused=lambda s, highest: refused.append((s.trainer_epoch, highest)))
    assert f.admit(sync(0, 1)) and f.admit(sync(1, 2)) and f.admit(sync(1, 3))
    assert not f.admit(sync(0, 4))                     # unfenced after an epoch was seen: refused
    assert f.admit(sync(3, 5)) and not f.admit(sync(2, 6)) and not f.admit(sync(1, 7))
    assert f.admit(sync(3, 8)) and f.highest == 3 and f.refused == 3
    assert refused == [(0, 1), (2, 3), (1, 3)]


def test_a_sync_carries_its_trainer_epoch_on_the_wire() -> None:
    frame = wire.encode(sync(7, 3))
    decoded = wire.decode(frame)
    assert isinstance(decoded, wire.Sync) and decoded.trainer_epoch == 7


class Generator:
    """The generator's real loop on a thread, wired over the in-process transport; ``trainers`` senders reach its
    inbox, its ACKs go to ``control_in`` (trainer 0's address)."""

    def __init__(self, *, trainers: int = 1) -> None:
        name = uuid.uuid4().hex
        self.receivers = {k: transport.open_receiver(f"mem://{k}-{name}") for k in ("gen", "ctl", "ver")}
        self.control_in = self.receivers["ctl"]
        self.own = [transport.open_sender([f"mem://{k}-{name}"], role="generator", index=0) for k in ("ctl", "ver")]
        self.trainers = [transport.open_sender([f"mem://gen-{name}"], role="trainer", index=0)
                         for _ in range(trainers)]
        self.weights, self.stop = Weights(), threading.Event()
        self.thread = threading.Thread(target=generator_role.run, kwargs=dict(
            index=0, inbox=self.receivers["gen"], control=self.own[0], verifiers=self.own[1], sampler=None,
            weights=self.weights, observer=Observer(), trainer_weights=WEIGHTS, should_stop=self.stop.is_set))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for snd in (*self.own, *self.trainers):
            snd.close()
        for r in self.receivers.values():
            r.close()


def test_the_generator_loop_refuses_a_stale_epochs_push_unanswered_and_reports_the_count() -> None:
    gen = Generator()
    try:
        for s in (sync(1, 1), sync(2, 2), sync(1, 3), sync(2, 4), sync(3, 5), sync(2, 6)):
            gen.trainers[0].send(s)
        gen.trainers[0].send(wire.Stop(reason="done"))
        gen.thread.start()
        gen.thread.join(20)
        assert not gen.thread.is_alive()
        assert gen.weights.loaded == [(1, 1), (2, 2), (2, 4), (3, 5)]
        acks = []
        while (msg := gen.control_in.recv(timeout=0.2)) is not None:
            if isinstance(msg, wire.Ack) and msg.of == wire.Kind.SYNC:
                acks.append((msg.version, trainer_push.fenced_of(msg.detail)))
        assert acks == [(1, 0), (2, 0), (4, 1), (5, 1)]      # v3 and v6 unanswered
    finally:
        gen.close()


@dataclasses.dataclass
class Flight:
    version: int

    def result(self) -> weightsync.SyncStats:
        return weightsync.SyncStats(version=self.version, bytes=8, seconds=0.01, tensors=1, buckets=1)


class Sender:
    """The broadcast's double: the push's notices and ACKs are real, the tensors go nowhere."""

    epoch = 0

    def start(self, tensors: Any, *, version: int) -> Flight:
        return Flight(version)

    def close(self) -> None: ...


def test_a_stale_trainers_push_times_out_while_the_current_one_learns_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer_push, "ACK_TIMEOUT_SECONDS", 1.0)
    gen = Generator(trainers=2)
    # the generator's ACKs lead to trainer 0's address: after the take-over that is the new trainer's (epoch 2)
    silent = transport.open_receiver(f"mem://stale-ctl-{uuid.uuid4().hex}")
    double: Any = Sender()
    pushers = {e: trainer_push.Pusher(generators=gen.trainers[e - 1], control=gen.control_in if e == 2 else silent,
                                      sender=double, tensors=lambda: [], host=WEIGHTS[0], port=WEIGHTS[1],
                                      world_size=2, backend="gloo", timeout_s=5, trainer_epoch=e) for e in (1, 2)}
    gen.thread.start()
    try:
        assert pushers[2].push(version=5, step=5).bytes == 8             # the replacement's first push
        assert pushers[1].push(version=9, step=9).seconds == 0.01        # the stale one: no ACK (its own figure)
        assert pushers[1].fenced_pushes == 0
        pushers[2].push(version=6, step=6)
        assert gen.weights.loaded == [(2, 5), (2, 6)]                    # the stale weights never loaded
        assert pushers[2].fenced_pushes == 1
    finally:
        gen.close()
        silent.close()
