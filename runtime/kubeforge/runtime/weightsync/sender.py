"""Trainer rank 0's end of the weight sync: plan, pack, broadcast, collect the receivers' ack.

API::

    sender = WeightSender(host=..., port=..., world_size=..., timeout=..., join_timeout=...)
    stats = sender.send(named_tensors, version=v)    # -> SyncStats(bytes, seconds, ...)
    stats = sender.send(stream, version=v)           # a TensorStream: meta first, tensors produced bucket by bucket
    flight = sender.start(named_tensors, version=v)  # snapshot now, broadcast in a background thread
    stats = flight.result()                          # join it (WeightSyncError if the broadcast failed)
    sender.reset(world_size=...)                     # abandon the epoch: the next sync forms the next one
    sender.close()

Neighbours: ``trainer.pusher`` owns one on rank 0; ``process_group`` (the group, joined on first use),
``rendezvous`` (epochs, the sync count, the close), ``metadata`` and ``bucketing`` (what goes on the wire).
Invariant: at most one sync is in flight; ``start``, ``send``, ``reset`` and ``close`` join the previous one first, so
syncs reach the receivers in version order.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from kubeforge.runtime.weightsync import bucketing, deltas, metadata, process_group, protocol, rendezvous


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prepared:
    """A sync packed and ready to broadcast: the sender's buffers hold a snapshot of the tensors."""

    version: int
    meta: bytes
    buckets: list[torch.Tensor]
    bytes: int
    tensors: int
    pack_seconds: float
    delta: deltas.Encoded | None = None   # offered against the receivers' version (the metadata says which)


class InFlight:
    """A sync broadcasting in a background thread; :meth:`result` joins it."""

    def __init__(self, run: Callable[[], protocol.SyncStats], *, version: int) -> None:
        self.version = version
        self._stats: protocol.SyncStats | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(run,), name=f"weightsync-v{version}", daemon=True)
        self._thread.start()

    def _run(self, run: Callable[[], protocol.SyncStats]) -> None:
        try:
            self._stats = run()
        except BaseException as e:  # noqa: BLE001 - handed to the joining thread
            self._error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float | None = None) -> protocol.SyncStats:
        """The sync's stats once the broadcast and every receiver's ack completed; WeightSyncError otherwise. The
        broadcast itself is bounded by the group's timeout, so the join is too."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise protocol.WeightSyncError(f"weight sync v{self.version}: still broadcasting after {timeout}s")
        if self._error is not None:
            if isinstance(self._error, protocol.WeightSyncError):
                raise self._error
            raise protocol.WeightSyncError(f"weight sync v{self.version} failed: {self._error}") from self._error
        assert self._stats is not None
        return self._stats


class WeightSender:
    """Trainer rank 0's end. ``send`` joins the group on first use (blocks until every receiver joined)."""

    def __init__(self, *, host: str, port: int, world_size: int, timeout: float = 120.0,
                 join_timeout: float = protocol.DEFAULT_JOIN_TIMEOUT, backend: str = "gloo",
                 bucket_mb: float = protocol.DEFAULT_BUCKET_MB, delta: bool = False) -> None:
        if world_size < 2:
            raise ValueError("weight sync: world_size must count the sender and at least one receiver")
        self._args = dict(host=host, port=port, world_size=world_size, rank=0, timeout=timeout,
                          join_timeout=join_timeout, backend=backend)
        self._host, self._port, self._join_timeout = host, port, join_timeout
        self.bucket_bytes = max(protocol.ALIGN, int(bucket_mb * (1 << 20)))
        self.group: process_group.Group | None = None
        self.epoch = 0
        self._store: Any = None
        self.buffers = bucketing.BucketBuffers()      # overlapped syncs: the snapshot, one buffer per bucket
        self.staging = bucketing.BucketBuffers()      # streaming syncs: one bucket-sized buffer
        self._flight: InFlight | None = None
        self.delta = delta                            # offer deltas against the receivers' version (``prepare``)
        self.delta_buffer = bucketing.GrowingBuffer()  # the delta's payload
        self._packed: int | None = None   # the version the snapshot (``buffers``) holds
        self.base: int | None = None      # ... when every receiver of this epoch acknowledged it: a delta's base

    def connect(self) -> None:
        if self.group is None:
            if self._store is None:
                self._store = rendezvous.open_store(host=self._host, port=self._port, rank=0,
                                                    join_timeout=self._join_timeout)
            self.group = process_group.open_group(**self._args, epoch=self.epoch,  # type: ignore[arg-type]
                                                  store=self._store)

    @property
    def world_size(self) -> int:
        return int(str(self._args["world_size"]))

    def reset(self, *, world_size: int | None = None) -> int:
        """Abandon the current epoch (its group is closed; anyone still joining it fails at once); the next
        ``send`` forms the next epoch, of ``world_size`` ranks when given (generators joined or left). Returns the
        new epoch."""
        self.wait()
        if world_size is not None:
            if world_size < 2:
                raise ValueError("weight sync: world_size must count the sender and at least one receiver")
            self._args["world_size"] = world_size
        if self._store is not None:
            try:
                prefixed: Any = dist.PrefixStore(  # type: ignore[attr-defined]
                    rendezvous.epoch_prefix(self.epoch), self._store)
                prefixed.set(rendezvous.ABANDONED_KEY, b"1")
            except (RuntimeError, dist.DistError):
                pass
        if self.group is not None:
            self.group.close()
            self.group = None
        self.epoch += 1
        self.base = None   # new members may hold any version
        return self.epoch

    def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | metadata.TensorStream, *,
             version: int) -> protocol.SyncStats:
        """Broadcast the tensors (HF names) as policy ``version``; return once every receiver has loaded them.

        Streaming: the metadata goes out first, then each tensor is produced (e.g. gathered from shards) only when
        its bucket is packed, into one reusable staging buffer (a tensor bigger than a bucket travels alone,
        uncopied), so at most one bucket is materialised. A plain iterable is listed first (tied weights once)."""
        self.wait()
        self.connect()
        assert self.group is not None
        group = self.group
        self.base = None   # the receivers' buffers will hold a version the snapshot does not
        stream = metadata.as_stream(named_tensors)
        metas, places, bucket_sizes, meta = self._plan(stream, version)
        staging = self.staging.get([max(bucket_sizes, default=0)], group.device)[0]
        return self._collectives(group, version, meta,
                                 bucketing.streamed(iter(stream), metas, places, bucket_sizes, staging),
                                 bytes=sum(metadata.nbytes(m) for m in metas), tensors=len(metas),
                                 buckets=len(bucket_sizes))

    def _collectives(self, group: process_group.Group, version: int, meta: bytes, payload: Iterable[torch.Tensor],
                     *, encoded: deltas.Encoded | None = None, **figures: int) -> protocol.SyncStats:
        """Header, metadata, (a delta offered: the receivers' vote), every bucket, then the receivers' ack; the
        stats, or WeightSyncError."""
        start = time.perf_counter()
        sent_delta = False
        try:
            announce(group)
            self._header(group, version, meta)
            if encoded is not None and encoded.worth and self._vote(group):
                sent_delta, payload = True, encoded.buckets
                figures = {**figures, "bytes": encoded.bytes, "buckets": len(encoded.buckets)}
            for buf in payload:
                group.broadcast(buf)
            failures, count = self._ack(group)
        except (RuntimeError, dist.DistError) as e:
            if isinstance(e, protocol.WeightSyncError):
                raise
            raise protocol.WeightSyncError(f"weight sync v{version} failed: {e}") from e
        compared: dict[str, Any] = {} if encoded is None else {
            "changed": encoded.changed / max(1, encoded.elements), "encode_seconds": encoded.seconds}
        return self._stats(group, version, failures, count, seconds=time.perf_counter() - start, delta=sent_delta,
                           full_bytes=encoded.full_bytes if encoded is not None else figures["bytes"], **compared,
                           **figures)

    @staticmethod
    def _vote(group: process_group.Group) -> bool:
        """Every receiver holds the offered base (each adds 1 when its buffers do): the delta may go out."""
        votes = torch.zeros(1, dtype=torch.int64, device=group.device)
        group.all_reduce_sum(votes)
        return int(votes[0]) == group.size - 1

    def _plan(self, stream: metadata.TensorStream,
              version: int) -> tuple[list[metadata.TensorMeta], list[tuple[int, int]], list[int], bytes]:
        metas = list(stream.meta)
        sizes = [metadata.nbytes(m) for m in metas]
        places = bucketing.plan_buckets(sizes, bucket_bytes=self.bucket_bytes)
        nb = places[-1][0] + 1 if places else 0
        bucket_sizes = [0] * nb
        for (b, off), size in zip(places, sizes):
            bucket_sizes[b] = max(bucket_sizes[b], off + size)
        entries = [{"name": m.name, "shape": list(m.shape), "dtype": metadata.dtype_name(m.dtype), "bucket": b,
                    "offset": off} for m, (b, off) in zip(metas, places)]
        return metas, places, bucket_sizes, metadata.encode_meta(version=version, entries=entries,
                                                                  bucket_sizes=bucket_sizes)

    @staticmethod
    def _header(group: process_group.Group, version: int, meta: bytes) -> None:
        group.broadcast(torch.tensor([protocol.MAGIC, protocol.PROTOCOL, version, len(meta)], dtype=torch.int64,
                                     device=group.device))
        group.broadcast(torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(group.device))

    @staticmethod
    def _ack(group: process_group.Group) -> tuple[int, int]:
        ack = torch.zeros(2, dtype=torch.int64, device=group.device)
        group.all_reduce_sum(ack)
        return int(ack[0]), int(ack[1])

    @staticmethod
    def _stats(group: process_group.Group, version: int, failures: int, count: int,
               **figures: Any) -> protocol.SyncStats:
        if failures or count != group.size - 1:
            raise protocol.WeightSyncError(f"weight sync v{version}: {failures} of {group.size - 1} receivers failed "
                                           f"to load ({count} acked)")
        return protocol.SyncStats(version=version, **figures)

    def start(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | metadata.TensorStream, *,
              version: int) -> InFlight:
        """Snapshot the tensors into the send buffers now (the caller may update its parameters as soon as this
        returns), then broadcast them in a background thread; :meth:`InFlight.result` joins it."""
        prepared = self.prepare(named_tensors, version=version)
        flight = InFlight(lambda: self.broadcast(prepared), version=version)
        self._flight = flight
        return flight

    def wait(self) -> None:
        """Join the sync in flight, if any (its outcome belongs to whoever holds its :class:`InFlight`)."""
        flight, self._flight = self._flight, None
        if flight is not None:
            try:
                flight.result()
            except protocol.WeightSyncError:
                pass

    def prepare(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | metadata.TensorStream, *,
                version: int) -> Prepared:
        """Plan the buckets and pack every tensor into this sender's per-layout buffers (one copy: the snapshot,
        a whole model's worth of memory, kept for the next sync of the same layout)."""
        self.wait()
        self.connect()
        assert self.group is not None
        start = time.perf_counter()
        stream = metadata.as_stream(named_tensors)
        metas, places, bucket_sizes, meta = self._plan(stream, version)
        layouts = self.buffers.allocations
        buffers = self.buffers.get(bucket_sizes, self.group.device)
        base = self.base if self.delta and self.base == self._packed and layouts == self.buffers.allocations else None
        self.base = self._packed = None   # the snapshot is about to change
        encoded = None
        if base is None:
            bucketing.pack(iter(stream), metas, places, buffers)
        else:
            encoded = deltas.pack_and_encode(iter(stream), metas, places, buffers, bucket_bytes=self.bucket_bytes,
                                             flat=self.delta_buffer)
            if encoded.worth:
                meta = _offered(meta, encoded, base=base)
        self._packed = version
        return Prepared(version=version, meta=meta, buckets=buffers, bytes=sum(metadata.nbytes(m) for m in metas),
                        tensors=len(metas), pack_seconds=time.perf_counter() - start, delta=encoded)

    def broadcast(self, prepared: Prepared) -> protocol.SyncStats:
        """The collectives of one prepared sync: header, metadata, buckets, then the receivers' ack."""
        self.connect()
        assert self.group is not None
        stats = self._collectives(self.group, prepared.version, prepared.meta, prepared.buckets,
                                  encoded=prepared.delta, bytes=prepared.bytes, tensors=prepared.tensors,
                                  buckets=len(prepared.buckets))
        if self._packed == prepared.version:   # every receiver holds what the snapshot holds: the next delta's base
            self.base = prepared.version
        return stats

    def close(self) -> None:
        """Join the sync in flight and close the group; receivers prefetching in the store see the epoch closed and
        stop polling before the store (served here) goes away."""
        self.wait()
        if self._store is not None and self.group is not None:
            try:
                prefixed: Any = dist.PrefixStore(  # type: ignore[attr-defined]
                    rendezvous.epoch_prefix(self.epoch), self._store)
                prefixed.set(rendezvous.CLOSED_KEY, b"1")
                deadline = time.monotonic() + rendezvous.CLOSE_WAIT_SECONDS
                while int(prefixed.add(rendezvous.LIVE_KEY, 0)) > 0 and time.monotonic() < deadline:
                    time.sleep(rendezvous.PREFETCH_POLL_SECONDS / 2)
            except (RuntimeError, dist.DistError):
                pass
        if self.group is not None:
            self.group.close()
            self.group = None


def _offered(meta: bytes, encoded: deltas.Encoded, *, base: int) -> bytes:
    """The full sync's metadata with the delta offered beside it (each entry's encoding, count and place)."""
    doc = json.loads(meta)
    for entry, fields in zip(doc["tensors"], encoded.fields):
        entry.update(fields)
    return metadata.encode_meta(version=int(doc["version"]), entries=doc["tensors"], bucket_sizes=doc["buckets"],
                                offer=metadata.Offer(base=base, buckets=encoded.bucket_sizes))


def announce(group: process_group.Group) -> None:
    """Sender: count one more sync in the epoch's store before its header, so a receiver waiting in the background
    (``WeightReceiver.prefetch``) enters the collectives only when there is one (no collective waits between syncs,
    where the group's short timeout would expire)."""
    store = getattr(group, "store", None)
    if store is not None:
        store.add(rendezvous.SYNCS_KEY, 1)
