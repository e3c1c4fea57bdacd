"""Trainer rank 0's weight push: a SYNC notice to every generator over ZeroMQ, then the broadcast, then the ACKs.

```
 rank 0 ──SYNC(v, store host:port, world)──▶ generator g inbox   (g reads it between batches)
 rank 0 ══ weightsync.WeightSender.send(named tensors, v) ══▶ every generator worker (gloo/NCCL, private group)
 generator g ──ACK(SYNC, v, detail={"seconds", "bytes", "fenced"})──▶ rank 0 control inbox
```

Fencing (docs/fencing.md): every SYNC carries this trainer's epoch (``trainer_epoch``); a generator that has seen a
newer one refuses it unanswered. The ACKs of accepted pushes carry each generator's count of refused pushes; the
highest per generator is kept (:attr:`Pusher.fenced_pushes`) for the progress report.

Neighbours: ``weightsync`` (the group and the bucketed broadcast), ``trainer.pushes`` (calls :meth:`Pusher.push`,
or :meth:`Pusher.start` and :meth:`Pusher.finish` when a push overlaps the next step), ``generator.loop`` (answers
SYNC, reports its receive+load time in the ACK).

Overlap (``start`` / ``finish``): the trainer's loop calls ``start`` after a step: the SYNC notices go out and the
weights are snapshotted into the sender's buffers on the loop's thread (so every WORK sent afterwards reaches each
generator behind the SYNC, and the next step may change the parameters at once), then the broadcast runs in a
background thread while the trainer collects and trains the next step. ``finish`` (before the next push, a
re-form, or the end) joins it and collects the ACKs; ACKs the loop reads meanwhile are handed over through
``acked``. ``push`` is ``start`` + ``finish``.

Reported figures: ``seconds`` is the slowest generator's receive-and-load time (from the first header it receives
to its ack: the time generation actually pauses); the sender's own time also counts the wait until every generator
finished its current batch, so it is kept only as a fallback. ``bytes`` is the payload of one copy.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from kubeforge.runtime import transport, types, weightsync, wire

ACK_TIMEOUT_SECONDS = 30.0


def ack_detail(result: types.SyncResult) -> str:
    return json.dumps({"seconds": result.seconds, "bytes": result.bytes})


def fenced_of(detail: str) -> int | None:
    """The count of refused pushes a generator's ACK detail carries (None when it carries none)."""
    try:
        value = json.loads(detail)["fenced"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if type(value) is int and value >= 0 else None


def parse_ack_detail(detail: str) -> types.SyncResult | None:
    try:
        doc = json.loads(detail)
        return types.SyncResult(seconds=float(doc["seconds"]), bytes=int(doc["bytes"]))
    except (ValueError, KeyError, TypeError):
        return None


class Pusher:
    """Implements ``trainer.pushes.WeightPusher`` over ZeroMQ notices and a ``weightsync.WeightSender``."""

    def __init__(self, *, generators: transport.Sender, control: transport.Receiver,
                 sender: weightsync.WeightSender, tensors: Callable[[], Iterable[tuple[str, torch.Tensor]]],
                 host: str, port: int, world_size: int, backend: str, timeout_s: int,
                 on_other: Callable[[wire.Message], Any] = lambda m: None, trainer_epoch: int = 0) -> None:
        self.generators = generators
        self.members = generators.peers            # generators in the weight-sync group now (elastic)
        self.targets = list(range(self.members))   # ... less those left out for silence; rank order in the group
        self.tensor_parallel_size = max(1, (world_size - 1) // max(1, generators.peers))
        self.control = control
        self.sender = sender
        self.tensors = tensors
        self.notice: dict[str, Any] = dict(host=host, port=port, world_size=world_size, backend=backend,
                                           timeout_s=timeout_s, trainer_epoch=trainer_epoch)
        self.fenced_by_generator: dict[int, int] = {}   # refused pushes each generator reported (its highest)
        self.on_other = on_other
        # the generators among those given that trainer 0 hears nothing from (``trainer.liveness``): a push stops
        # waiting for their ACKs at once (``trainer.membership`` sets it)
        self.gone: Callable[[Iterable[int]], set[int]] = lambda generators: set()
        self.send_within: Callable[[], float] = lambda: ACK_TIMEOUT_SECONDS   # a SYNC notice's bound (ditto)
        self._flight: weightsync.InFlight | None = None
        self._acked: list[wire.Ack] = []

    def reform(self, *, members: int | None = None, left_out: frozenset[int] = frozenset()) -> int:
        """Abandon the weight-sync epoch (a generator left, came back, joined or went silent); the next push forms
        the next one, over ``members`` generators when given, less those ``left_out`` (the rest take their ranks in
        index order: each SYNC names its receiver's ``rank_base``)."""
        self.finish_quietly()
        if members is not None:
            self.members = members
        self.targets = [g for g in range(self.members) if g not in left_out] or [0]
        self.notice["world_size"] = weightsync.world_size(generators=len(self.targets),
                                                          tensor_parallel_size=self.tensor_parallel_size)
        return self.sender.reset(world_size=int(self.notice["world_size"]))

    def push(self, *, version: int, step: int) -> types.SyncResult:
        self.start(version=version, step=step)
        result = self.finish()
        assert result is not None
        return result

    def start(self, *, version: int, step: int) -> None:
        """SYNC notices, snapshot, broadcast in the background (see the module docstring)."""
        self.finish_quietly()
        silent = self.gone(self.targets)
        if silent:       # left out at the next check: this push would only wait for them
            raise weightsync.WeightSyncError(f"weight sync v{version}: generators {sorted(silent)} silent")
        for rank, g in enumerate(self.targets):   # bounded: a generator gone without a word fails the push
            sync = wire.Sync(version=version, step=step, epoch=self.sender.epoch, **self.notice,
                             rank_base=weightsync.rank_base(generator_index=rank,
                                                            tensor_parallel_size=self.tensor_parallel_size))
            self.generators.send(sync, to=g, timeout=self.send_within())
        self._acked = []
        self._flight = self.sender.start(self.tensors(), version=version)

    @property
    def fenced_pushes(self) -> int:
        """Pushes of stale trainer epochs the generators refused, as they last reported them."""
        return sum(self.fenced_by_generator.values())

    @property
    def in_flight(self) -> bool:
        return self._flight is not None

    def acked(self, msg: wire.Ack) -> None:
        """An ACK of the sync in flight that the trainer's loop read from the control inbox."""
        if self._flight is not None and msg.of == wire.Kind.SYNC and msg.version == self._flight.version:
            self._acked.append(msg)

    def finish(self) -> types.SyncResult | None:
        """Join the sync in flight (None when there is none); raises ``WeightSyncError`` when it failed."""
        flight, self._flight = self._flight, None
        if flight is None:
            return None
        stats = flight.result()
        acks = self._acks(flight.version, early=self._acked)
        seconds = max((a.seconds for a in acks), default=stats.seconds)
        return types.SyncResult(seconds=seconds, bytes=stats.bytes)

    def finish_quietly(self) -> None:
        """Join the sync in flight, ignoring its outcome (a re-form or the end of the run follows)."""
        try:
            self.finish()
        except RuntimeError:
            pass

    def _acks(self, version: int, *, early: Sequence[wire.Ack] = ()) -> list[types.SyncResult]:
        want = set(self.targets)
        got: list[types.SyncResult] = []

        failed: list[str] = []

        def take(ack: wire.Ack) -> None:
            want.discard(ack.index)
            fenced = fenced_of(ack.detail)
            if fenced is not None:
                self.fenced_by_generator[ack.index] = max(fenced, self.fenced_by_generator.get(ack.index, 0))
            if not ack.ok:   # received (the group acked it) but not loaded: as a failed collective ack before
                failed.append(f"generator {ack.index}: {ack.detail}")
                return
            parsed = parse_ack_detail(ack.detail)
            if parsed is not None:
                got.append(parsed)

        def read(timeout: float) -> bool:
            msg = self.control.recv(timeout=timeout)
            if isinstance(msg, wire.Ack) and msg.of == wire.Kind.SYNC and msg.version == version:
                take(msg)
            elif msg is not None:
                self.on_other(msg)
            return msg is not None

        for ack in early:
            take(ack)
        deadline = time.monotonic() + ACK_TIMEOUT_SECONDS
        while want and time.monotonic() < deadline:
            # what waits is read before silence is judged: after a train step longer than the silence, the
            # ACKs and beats that came meanwhile are in the inbox, unheard, and a live generator is not silent
            while want and time.monotonic() < deadline and read(0.0):
                pass
            silent = self.gone(want)
            if silent:               # their beats stopped: no ACK is coming
                failed.append(f"generators {sorted(silent)} silent")
                break
            read(0.5)
        if failed:
            raise weightsync.WeightSyncError(f"weight sync v{version}: loading failed on {'; '.join(failed)}")
        return got if not want else []

    def close(self) -> None:
        self.finish_quietly()
        self.sender.close()
