"""A generator worker's end of the weight sync: receive into reusable buffers, hand the tensors to a loader.

API::

    receiver = WeightReceiver(host=..., port=..., world_size=..., rank=..., timeout=...)    # a vLLM worker
    stats = receiver.receive(load)   # load(iterator of (name, tensor)) consumes the new weights
    receiver.prefetch(prepare)       # receive the next sync in the background, into the reusable buffers, and
                                     # prepare(staged) there too while it arrives (the engine builds its next
                                     # kernels off the pause, layer by layer as their bytes land)
    staged = receiver.take()         # join it; receiver.load_staged(staged, load) loads it (the pause)
    receiver.close()

Neighbours: ``generator.extension`` owns one inside each vLLM worker (reached through ``collective_rpc``);
``process_group`` (joined at construction), ``rendezvous`` (the sync count a prefetch polls, the close),
``metadata`` (validated before anything is allocated), ``bucketing`` (the reusable buffers). Invariant: every
receiver takes part in every step even when its ``load`` fails (it drains the remaining buckets and acks a
failure), so one failing loader never leaves the others blocked.
"""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from kubeforge.runtime.weightsync import bucketing, deltas, metadata, process_group, protocol, rendezvous


Loader = Callable[[Iterator[tuple[str, torch.Tensor]]], None]
Preparer = Callable[["Staged"], Any]



@dataclasses.dataclass(frozen=True, kw_only=True)
class Staged:
    """One sync received into the receiver's buffers and acknowledged, not yet loaded (while the prefetch's
    ``prepare`` runs, still arriving: ``tensors`` then waits for each bucket)."""

    version: int
    entries: list[dict[str, Any]]
    buffers: list[torch.Tensor]
    bytes: int
    seconds: float            # header to last bucket
    prepared: Any = None      # what the prefetch's ``prepare`` returned (None: none given, or it declined)
    prepare_error: BaseException | None = None   # what it raised (the received bytes are still staged)
    prepare_seconds: float = 0.0
    prepare_wait_seconds: float = 0.0   # of prepare_seconds: waiting for buckets still on the wire
    ready_seconds: float = 0.0          # header to received whole and prepared
    arrivals: _Arrivals | None = dataclasses.field(default=None, repr=False, compare=False)  # while arriving
    applier: deltas.Applier | None = dataclasses.field(default=None, repr=False, compare=False)
    full_bytes: int = 0

    @property
    def full(self) -> list[torch.Tensor]:
        """The receive buffers ``tensors`` hands out views of (a delta's payload lands in ``buffers`` instead)."""
        return self.applier.full if self.applier is not None else self.buffers

    def places(self) -> list[tuple[int, int, int]]:
        """Each tensor's (bucket, byte offset, bytes) in ``full``, in the order ``tensors`` hands them out."""
        return [(int(e["bucket"]), int(e["offset"]), _tensor_bytes(e)) for e in self.entries]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, view into the receive buffers, whole: a delta is applied first): valid until the receiver's
        next sync. While the sync is still arriving (inside ``prepare``), each bucket's tensors come once that bucket
        has landed (bounded by the group's timeout; a broken receive raises ``WeightSyncError``)."""
        applier = self.applier or deltas.Applier(self.entries, self.buffers, None)
        for i, e in enumerate(self.entries):
            if self.arrivals is not None and applier.wire_bucket(i) >= 0:
                self.arrivals.wait(applier.wire_bucket(i))
            yield e["name"], applier.tensor(i)


class _Arrivals:
    """The buckets of one prefetched sync, all enqueued at once as asynchronous broadcasts (the backend receives
    them in its own threads, in order) so the prefetch thread can prepare the buckets that have landed while the
    rest is on the wire. ``wait(b)`` returns once buckets 0..b have arrived; the last arrival acks the sync
    (received whole: the sender is free before the preparation ends). Every wait is bounded by the group's
    timeout; the first failure is kept and raised by every later wait."""

    def __init__(self, group: process_group.Group, buffers: list[torch.Tensor], start: float) -> None:
        self.group, self.start = group, start
        self.waits = [group.broadcast_async(buf) for buf in buffers]
        self.arrived = 0
        self.acked = False
        self.seconds = 0.0      # header to the last bucket
        self.waited = 0.0       # time spent blocked in wait()
        self.error: protocol.WeightSyncError | None = None

    def wait(self, bucket: int) -> None:
        if self.error is not None:
            raise self.error
        if self.arrived > bucket and (self.acked or self.arrived < len(self.waits)):
            return
        started = time.perf_counter()
        try:
            while self.arrived <= bucket:
                self.waits[self.arrived]()
                self.arrived += 1
            if self.arrived == len(self.waits) and not self.acked:
                self.seconds = time.perf_counter() - self.start
                self.group.all_reduce_sum(torch.tensor([0, 1], dtype=torch.int64, device=self.group.device))
                self.acked = True
        except (RuntimeError, dist.DistError) as e:
            self.error = e if isinstance(e, protocol.WeightSyncError) else protocol.WeightSyncError(
                f"weight sync receive failed on rank {self.group.rank} after {self.arrived} of {len(self.waits)} "
                f"buckets: {e}")
            raise self.error from e
        finally:
            self.waited += time.perf_counter() - started

    def finish(self) -> None:
        """Wait for whatever has not arrived yet and ack (WeightSyncError when the receive failed)."""
        self.wait(len(self.waits) - 1)


class WeightReceiver:
    """A generator worker's end. ``receive`` blocks until the sender's next sync and hands tensors to ``load``.

    Prefetch (``prefetch`` / ``take``): a background thread waits for the next sync (polling the epoch's sync count
    in the store, not in a collective) and receives it whole into the reusable buffers while the engine keeps
    generating (its ``prepare`` consuming each bucket as it lands); ``take`` joins it and hands over the staged sync,
    so loading is all that is left for the pause. The staged buffers stay valid until the next
    ``prefetch``/``receive``: start the next prefetch only after the staged tensors are loaded."""

    def __init__(self, *, host: str, port: int, world_size: int, rank: int, timeout: float = 120.0,
                 join_timeout: float = protocol.DEFAULT_JOIN_TIMEOUT, backend: str = "gloo", epoch: int = 0,
                 auth_key: bytes | None = None) -> None:
        if rank < 1:
            raise ValueError("weight sync: receivers have ranks >= 1 (rank 0 is the trainer)")
        self.group: process_group.Group = process_group.open_group(
            host=host, port=port, world_size=world_size, rank=rank, timeout=timeout, join_timeout=join_timeout,
            backend=backend, epoch=epoch, auth_key=auth_key)
        self.buffers = bucketing.BucketBuffers()     # the full layout: every sync's tensors, and a delta's base
        self.delta_buffer = bucketing.GrowingBuffer()  # a delta's payload
        self.base: int | None = None       # the version ``buffers`` hold whole (None while a sync lands in them)
        self.seen = 0                      # syncs of this epoch received so far
        self._live = self._count_live(1)   # counted among the epoch's live receivers (the sender's close waits)
        self._stop = threading.Event()
        self._prefetch: threading.Thread | None = None
        self._staged: Staged | None = None
        self._error: BaseException | None = None

    def receive(self, load: Loader) -> protocol.SyncStats:
        """Receive one sync; ``load`` gets an iterator of (HF name, tensor) that receives buckets lazily."""
        if self._prefetch is not None:   # one was prefetched: load it (same stats, same errors)
            return self.load_staged(self.take(), load)
        group = self.group
        start = time.perf_counter()
        try:
            version, entries, applier = self._begin(group)
            stream = _BucketStream(group, applier)
            error: BaseException | None = None
            try:
                load(iter(stream))
            except Exception as e:  # noqa: BLE001 - reported to the sender through the ack, then re-raised
                error = e
            stream.drain()
            try:
                applier.finish()
            except protocol.WeightSyncError as e:   # a delta that does not fit: acked as a failure
                error = error or e
            group.all_reduce_sum(torch.tensor([1 if error else 0, 1], dtype=torch.int64, device=group.device))
        except (RuntimeError, dist.DistError) as e:
            if isinstance(e, protocol.WeightSyncError):
                raise
            raise protocol.WeightSyncError(f"weight sync receive failed on rank {group.rank}: {e}") from e
        if not any(not done for done in applier.applied):
            self.base = version
        if error is not None:
            raise protocol.WeightSyncError(f"weight sync v{version}: loading failed: {error}") from error
        return protocol.SyncStats(version=version, bytes=stream.bytes, seconds=time.perf_counter() - start,
                                  tensors=len(entries), buckets=stream.buckets, delta=applier.is_delta,
                                  full_bytes=_full_bytes(entries))

    def _begin(self, group: process_group.Group) -> tuple[int, list[dict[str, Any]], deltas.Applier]:
        """Header and metadata of the next sync, and (a delta offered) the vote; how its tensors will be read."""
        header = torch.zeros(4, dtype=torch.int64, device=group.device)
        group.broadcast(header)
        magic, proto, version, meta_len = (int(x) for x in header.tolist())
        if magic != protocol.MAGIC or proto != protocol.PROTOCOL or not 0 < meta_len <= protocol.MAX_META_BYTES:
            raise protocol.WeightSyncError(
                f"weight sync: bad header {header.tolist()} (protocol {protocol.PROTOCOL} expected)")
        raw = torch.empty(meta_len, dtype=torch.uint8, device=group.device)
        group.broadcast(raw)
        meta_version, entries, buckets, offer = metadata.decode_sync_meta(bytes(raw.cpu().numpy()))
        self.seen += 1
        wire: list[torch.Tensor] | None = None
        if offer is not None:   # yes only when the buffers hold the offered base whole, in the same layout
            held = (self.base == offer.base and self.buffers.layout == (str(group.device), tuple(buckets)))
            votes = torch.tensor([1 if held else 0], dtype=torch.int64, device=group.device)
            group.all_reduce_sum(votes)
            if int(votes[0]) == group.size - 1:
                wire = self.delta_buffer.views(offer.buckets, group.device)
        self.base = None   # the buffers change from here on
        return meta_version, entries, deltas.Applier(entries, self.buffers.get(buckets, group.device), wire)

    # ------------------------------------------------------------ prefetch

    def prefetch(self, prepare: Preparer | None = None) -> None:
        """Start receiving the next sync in the background (no-op while one is prefetching or staged). Once its
        metadata is in, every bucket is enqueued and ``prepare(staged)`` runs in the same thread while they land
        (``staged.tensors()`` waits for each bucket: the preparation is pipelined with the wire); the last bucket
        acks the sync. Its result (or error) travels in the ``Staged`` that ``take`` returns; a receive that breaks
        under it fails the prefetch instead."""
        if self._prefetch is not None:
            return
        self._staged, self._error = None, None
        self._stop.clear()
        self._prefetch = threading.Thread(target=self._prefetch_run, args=(prepare,), name="weightsync-prefetch",
                                          daemon=True)
        self._prefetch.start()

    @property
    def prefetching(self) -> bool:
        """A prefetch was started and not yet taken."""
        return self._prefetch is not None

    @property
    def staged(self) -> bool:
        """A prefetched sync is in the buffers, prepared (``take`` will not wait)."""
        return self._prefetch is not None and not self._prefetch.is_alive()

    def _prefetch_run(self, prepare: Preparer | None) -> None:
        group = self.group
        try:
            store = getattr(group, "store", None)
            while store is not None and int(store.add(rendezvous.SYNCS_KEY, 0)) <= self.seen:
                if self._stop.is_set():
                    return
                if store.check([rendezvous.ABANDONED_KEY]):
                    raise protocol.WeightSyncError("weight sync: this epoch was abandoned (the membership re-formed)")
                if store.check([rendezvous.CLOSED_KEY]):
                    if self._live:
                        self._live = not self._count_live(-1)   # seen: the sender may go (and its store with it)
                    raise protocol.WeightSyncError("weight sync: the sender closed the group")
                time.sleep(rendezvous.PREFETCH_POLL_SECONDS)
            start = time.perf_counter()
            version, entries, applier = self._begin(group)
            wire = applier.wire if applier.wire is not None else applier.full
            nbytes = sum(applier.wire_bytes(i) for i in range(len(entries)))
            arrivals = _Arrivals(group, wire, start)   # every bucket enqueued: the wire runs on its own
            staged = Staged(version=version, entries=entries, buffers=wire, bytes=nbytes, seconds=0.0,
                            arrivals=arrivals, applier=applier, full_bytes=_full_bytes(entries))
            prepared, error, prepare_s = None, None, 0.0
            if prepare is not None:   # pipelined: it consumes each bucket as it lands
                started = time.perf_counter()
                try:
                    prepared = prepare(staged)
                except Exception as e:  # noqa: BLE001 - handed to ``take`` with the staged sync
                    error = e
                prepare_s = time.perf_counter() - started
            waited = arrivals.waited
            # received whole (the rest waited for here) and acked: a failed receive fails the prefetch, whatever
            # the preparation made of the part it saw; a failed load is reported by the role's ACK
            arrivals.finish()
            applier.finish()          # what the preparation did not ask for: the buffers hold the new version
            self.base = version
            staged = dataclasses.replace(staged, seconds=arrivals.seconds, prepared=prepared, prepare_error=error,
                                         prepare_seconds=prepare_s, prepare_wait_seconds=waited,
                                         ready_seconds=time.perf_counter() - start, arrivals=None)
        except BaseException as e:  # noqa: BLE001 - handed to ``take``
            self._error = e
            return
        self._staged = staged

    def take(self, timeout: float | None = None) -> Staged:
        """The prefetched sync (waits for it, at most ``timeout``; the collectives inside are bounded by the
        group's own timeout); WeightSyncError when the receive failed or none was started."""
        thread = self._prefetch
        if thread is None:
            raise protocol.WeightSyncError("weight sync: take() without prefetch()")
        thread.join(timeout)
        if thread.is_alive():
            raise protocol.WeightSyncError(f"weight sync: no sync arrived within {timeout}s")
        self._prefetch = None
        error, staged = self._error, self._staged
        self._error = self._staged = None
        if error is not None:
            if isinstance(error, protocol.WeightSyncError):
                raise error
            raise protocol.WeightSyncError(f"weight sync receive failed on rank {self.group.rank}: {error}") from error
        if staged is None:
            raise protocol.WeightSyncError("weight sync: the prefetch was stopped")
        return staged

    @staticmethod
    def load_staged(staged: Staged, load: Loader) -> protocol.SyncStats:
        """Hand a staged sync to ``load``; ``seconds`` is the load's own time (the generation pause)."""
        start = time.perf_counter()
        try:
            load(staged.tensors())
        except Exception as e:
            raise protocol.WeightSyncError(f"weight sync v{staged.version}: loading failed: {e}") from e
        return protocol.SyncStats(version=staged.version, bytes=staged.bytes, seconds=time.perf_counter() - start,
                         tensors=len(staged.entries), buckets=len(staged.buffers), receive_seconds=staged.seconds,
                         prepare_seconds=staged.prepare_seconds, prepare_wait_seconds=staged.prepare_wait_seconds,
                         ready_seconds=staged.ready_seconds, delta=staged.applier is not None
                         and staged.applier.is_delta, full_bytes=staged.full_bytes)

    def _count_live(self, delta: int) -> bool:
        store = getattr(self.group, "store", None)
        if store is None:
            return False
        try:
            store.add(rendezvous.LIVE_KEY, delta)
        except (RuntimeError, dist.DistError):
            return False
        return True

    def close(self) -> None:
        self._stop.set()
        thread, self._prefetch = self._prefetch, None
        if thread is not None:
            thread.join(1.0)   # waiting in the store: returns within a poll; inside collectives: closing breaks it
        if self._live:         # not told of a close: the sender may still be there (never after it went: no store)
            self._live = not self._count_live(-1)
        self.group.close()
        if thread is not None:
            thread.join(5.0)


class _BucketStream:
    """Receives buckets in order, into the receiver's reusable buffers (a delta: its payload buffer), as the loader
    iterates, and hands out each tensor whole; ``drain`` receives whatever the loader left."""

    def __init__(self, group: process_group.Group, applier: deltas.Applier) -> None:
        self.group, self.applier = group, applier
        self.buffers = applier.wire if applier.wire is not None else applier.full
        self.received = 0
        self.bytes = 0

    @property
    def buckets(self) -> int:
        return len(self.buffers)

    def _next_bucket(self) -> None:
        self.group.broadcast(self.buffers[self.received])
        self.received += 1

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for i, e in enumerate(self.applier.entries):
            while self.received <= self.applier.wire_bucket(i):
                self._next_bucket()
            self.bytes += self.applier.wire_bytes(i)
            yield e["name"], self.applier.tensor(i)
        self.drain()

    def drain(self) -> None:
        while self.received < len(self.buffers):
            self._next_bucket()


def _full_bytes(entries: list[dict[str, Any]]) -> int:
    return sum(_tensor_bytes(e) for e in entries)


def _tensor_bytes(e: dict[str, Any]) -> int:
    return int(math.prod(e["shape"])) * protocol.DTYPES[e["dtype"]].itemsize
