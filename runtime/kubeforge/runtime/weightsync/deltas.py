"""A sync's deltas at both ends: the sender encodes each new tensor against the snapshot it overwrites (the version
the receivers hold); a receiver applies them to its receive buffers (its copy of that version) and hands out full
tensors as before.

Neighbours: ``delta`` (the per-tensor codec), ``bucketing`` (the placer and the growing flat buffer the payload
lives in), ``metadata`` (the ``Offer`` and each entry's ``enc``/``count``/``dbucket``/``doffset``); ``sender``
calls :func:`pack_and_encode`, ``receiver`` builds an :class:`Applier` per sync.

Invariants:
- The snapshot is overwritten only after its tensor was compared: when :func:`pack_and_encode` returns, the sender's
  buffers hold the new version whether or not a delta is offered (the full copy stays the fallback).
- A tensor's payload is never larger than the tensor (``delta.cheapest``), and the whole delta is offered only when
  its buckets are smaller than the full ones; a FULL tensor's bytes are copied into the payload only then.
- A receiver's tensor is applied at most once per sync, before it is first handed out; ``Applier.finish`` applies
  what no loader asked for, so the buffers hold the whole new version once the sync is done.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from kubeforge.runtime.weightsync import bucketing, delta, metadata, protocol


@dataclasses.dataclass(frozen=True, kw_only=True)
class Encoded:
    """The delta of one snapshot: per tensor its entry fields, the payload's buckets (views of the flat buffer)."""

    fields: list[dict[str, Any]]
    bucket_sizes: list[int]
    buckets: list[torch.Tensor]
    bytes: int               # payload bytes (what goes on the wire)
    full_bytes: int          # the full copy's
    changed: int             # elements whose bits changed
    elements: int
    seconds: float

    @property
    def worth(self) -> bool:
        """Smaller than the full copy: offered (otherwise the sync goes out full and ``buckets`` is empty)."""
        return sum(self.bucket_sizes) < self.full_bytes


def full_view(buffers: list[torch.Tensor], place: tuple[int, int], m: metadata.TensorMeta) -> torch.Tensor:
    """Tensor ``m`` at ``place`` in bucket buffers, as its dtype and shape (a view)."""
    bucket, off = place
    return buffers[bucket][off:off + metadata.nbytes(m)].view(m.dtype).view(m.shape)


def pack_and_encode(tensors: Iterator[tuple[str, torch.Tensor]], metas: list[metadata.TensorMeta],
                    places: list[tuple[int, int]], buffers: list[torch.Tensor], *, bucket_bytes: int,
                    flat: bucketing.GrowingBuffer) -> Encoded:
    """Pack each tensor into its place in ``buffers`` (as ``bucketing.pack``) after encoding it against what that
    place held (the receivers' version); the delta (not ``worth`` offering when it is not smaller than the full
    copy: then its FULL tensors were never copied and it has no buckets)."""
    start = time.perf_counter()
    device = buffers[0].device if buffers else torch.device("cpu")
    placer = bucketing.Placer(bucket_bytes=bucket_bytes)
    fields: list[dict[str, Any]] = []
    deferred: list[tuple[int, int, int]] = []      # FULL payloads: (tensor, flat offset, bytes), copied at the end
    used = payload = changed = elements = 0
    for i, (m, place) in enumerate(zip(metas, places)):
        new = bucketing.checked(next(tensors, (None, None)), m, i).to(device)
        view = full_view(buffers, place, m)
        enc, count, mask = delta.choose(new, view)
        size = delta.payload_bytes(enc=enc, numel=new.numel(), count=count, elem=new.element_size())
        dbucket, doffset = placer.place(size) if size else (-1, 0)
        if size:
            at = placer.starts[dbucket] + doffset
            data = flat.ensure(at + size, device, keep=used)
            used = at + size
            if enc is delta.Encoding.FULL:
                deferred.append((i, at, size))
            else:
                delta.encode(new, enc=enc, count=count, mask=mask, out=data[at:at + size])
        view.copy_(new)
        fields.append({"enc": enc.value, "count": count, "dbucket": dbucket, "doffset": doffset})
        payload, changed, elements = payload + size, changed + count, elements + new.numel()
    full = sum(metadata.nbytes(m) for m in metas)
    if sum(placer.sizes) >= full:
        return Encoded(fields=fields, bucket_sizes=list(placer.sizes), buckets=[], bytes=payload, full_bytes=full,
                       changed=changed, elements=elements, seconds=time.perf_counter() - start)
    for i, at, size in deferred:
        flat.data[at:at + size].copy_(full_view(buffers, places[i], metas[i]).reshape(-1).view(torch.uint8))
    return Encoded(fields=fields, bucket_sizes=list(placer.sizes),
                   buckets=[flat.data[a:a + n] for a, n in zip(placer.starts, placer.sizes)], bytes=payload,
                   full_bytes=full, changed=changed, elements=elements, seconds=time.perf_counter() - start)


class Applier:
    """The tensors of one sync as views of the receive buffers: for a delta, each applied to the base there the first
    time it is asked for. ``wire_bucket(i)``: the broadcast entry ``i`` needs (-1: none)."""

    def __init__(self, entries: list[dict[str, Any]], full: list[torch.Tensor],
                 wire: list[torch.Tensor] | None) -> None:
        self.entries, self.full, self.wire = entries, full, wire
        self.applied = [wire is None] * len(entries)

    @property
    def is_delta(self) -> bool:
        return self.wire is not None

    def wire_bucket(self, i: int) -> int:
        e = self.entries[i]
        return int(e["bucket"]) if self.wire is None else int(e["dbucket"])

    def wire_bytes(self, i: int) -> int:
        e = self.entries[i]
        if self.wire is None:
            return int(math.prod(e["shape"])) * _dtype(e).itemsize
        return metadata.payload_size(e)

    def tensor(self, i: int) -> torch.Tensor:
        e = self.entries[i]
        dtype = _dtype(e)
        n = int(math.prod(e["shape"])) * dtype.itemsize
        view: torch.Tensor = self.full[e["bucket"]][e["offset"]:e["offset"] + n].view(dtype).view(e["shape"])
        if not self.applied[i]:
            assert self.wire is not None
            size = metadata.payload_size(e)
            payload = (self.wire[e["dbucket"]][e["doffset"]:e["doffset"] + size] if size
                       else torch.empty(0, dtype=torch.uint8, device=view.device))
            try:
                delta.apply(view, enc=delta.Encoding(e["enc"]), count=e["count"], payload=payload)
            except protocol.WeightSyncError as err:
                raise protocol.WeightSyncError(f"weight sync: {e['name']!r}: {err}") from err
            self.applied[i] = True
        return view

    def finish(self) -> None:
        """Apply every tensor no loader asked for: the buffers now hold the whole new version."""
        for i, done in enumerate(self.applied):
            if not done:
                self.tensor(i)


def _dtype(e: dict[str, Any]) -> torch.dtype:
    return protocol.DTYPES[e["dtype"]]

