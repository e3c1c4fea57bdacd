"""Buckets: tensors placed back to back (aligned) into a few large uint8 buffers, one broadcast each.

Consecutive tensors share a bucket while it stays within the bucket size; a tensor larger than that travels alone,
uncopied. Both ends keep one set of bucket buffers per layout (:class:`BucketBuffers`: allocated on the first sync of
that layout, reused by every later one; a new layout replaces them). The sender packs a snapshot of every tensor
(:func:`pack`, overlapped syncs) or fills one reusable staging buffer bucket by bucket as the tensors are produced
(:func:`streamed`, streaming syncs: its memory stays one bucket).

Neighbours: ``sender`` plans with :func:`plan_buckets` and packs with these; ``receiver`` receives into
:class:`BucketBuffers`; ``metadata`` describes each tensor's place.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from kubeforge.runtime.weightsync import metadata, protocol


def _aligned(n: int) -> int:
    return (n + protocol.ALIGN - 1) // protocol.ALIGN * protocol.ALIGN


def plan_buckets(sizes: list[int], *, bucket_bytes: int) -> list[tuple[int, int]]:
    """Place tensors of ``sizes`` bytes into buckets, in order: (bucket index, byte offset) per tensor.

    Consecutive tensors share a bucket while it stays within ``bucket_bytes``; a tensor larger than that travels
    alone. Offsets are aligned to :data:`ALIGN` so every view is aligned for its dtype.
    """
    placer = Placer(bucket_bytes=bucket_bytes)
    return [placer.place(size) for size in sizes]


class Placer:
    """:func:`plan_buckets` one tensor at a time (a delta's sizes are known only as it is encoded); ``sizes`` holds
    each bucket's extent so far, ``starts`` where each begins when the buckets lie back to back in one flat buffer
    (aligned, as :func:`flat_views` cuts them)."""

    def __init__(self, *, bucket_bytes: int) -> None:
        self.bucket_bytes = bucket_bytes
        self.sizes: list[int] = []
        self.starts: list[int] = []

    def place(self, size: int) -> tuple[int, int]:
        start = _aligned(self.sizes[-1]) if self.sizes else 0
        if not self.sizes or start + size > self.bucket_bytes:
            self.starts.append(_aligned(self.starts[-1] + self.sizes[-1]) if self.sizes else 0)
            self.sizes.append(0)
            start = 0
        self.sizes[-1] = start + size
        return len(self.sizes) - 1, start


def flat_starts(sizes: Sequence[int]) -> list[int]:
    """Where each bucket of ``sizes`` begins when they lie back to back, aligned, in one flat buffer."""
    starts, at = [], 0
    for size in sizes:
        starts.append(at)
        at = _aligned(at + size)
    return starts


class GrowingBuffer:
    """One flat uint8 buffer that only grows (a delta's size changes from sync to sync: it is allocated again only
    when a sync needs more than any before), cut into buckets that lie back to back."""

    def __init__(self) -> None:
        self.data = torch.empty(0, dtype=torch.uint8)
        self.allocations = 0

    def ensure(self, nbytes: int, device: torch.device, *, keep: int = 0) -> torch.Tensor:
        """At least ``nbytes`` on ``device``, the first ``keep`` bytes kept across a reallocation."""
        if self.data.numel() < nbytes or self.data.device != device:
            grown = torch.empty(max(nbytes, self.data.numel() * 5 // 4), dtype=torch.uint8, device=device)
            if keep and self.data.device == device:
                grown[:keep].copy_(self.data[:keep])
            self.data = grown
            self.allocations += 1
        return self.data

    def views(self, sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
        """The buckets of ``sizes``, back to back (:func:`flat_starts`)."""
        starts = flat_starts(sizes)
        data = self.ensure(starts[-1] + sizes[-1] if sizes else 0, device)
        return [data[a:a + n] for a, n in zip(starts, sizes)]


class BucketBuffers:
    """One set of bucket buffers per layout: allocated when the bucket sizes (or device) change, reused otherwise."""

    def __init__(self) -> None:
        self.layout: tuple[str, tuple[int, ...]] | None = None
        self.buffers: list[torch.Tensor] = []
        self.allocations = 0     # how many times a layout was allocated (tests: once per layout)

    def get(self, sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
        key = (str(device), tuple(int(x) for x in sizes))
        if key != self.layout:
            self.buffers = []      # release the old layout before allocating the new one
            self.buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in key[1]]
            self.layout = key
            self.allocations += 1
        return self.buffers


def streamed(tensors: Iterator[tuple[str, torch.Tensor]], metas: list[metadata.TensorMeta],
             places: list[tuple[int, int]], sizes: list[int], staging: torch.Tensor) -> Iterator[torch.Tensor]:
    """The bucket buffers in order, filled from ``tensors`` as they come (checked against ``metas``): a lone tensor
    travels as itself, uncopied; shared buckets are packed into ``staging`` (reused: each broadcast completes
    before the next bucket is packed)."""
    i = 0
    for bucket, size in enumerate(sizes):
        members = []
        while i < len(metas) and places[i][0] == bucket:
            members.append((checked(next(tensors, (None, None)), metas[i], i).to(staging.device), places[i][1]))
            i += 1
        if len(members) == 1 and members[0][1] == 0:
            yield members[0][0].reshape(-1).view(torch.uint8)
            continue
        buf = staging[:size]
        for t, off in members:
            flat = t.reshape(-1).view(torch.uint8)
            buf[off:off + flat.numel()].copy_(flat)
        yield buf


def checked(item: tuple[str | None, torch.Tensor | None], m: metadata.TensorMeta, i: int) -> torch.Tensor:
    name, t = item
    if t is None or name != m.name or tuple(t.shape) != tuple(m.shape) or t.dtype != m.dtype:
        raise protocol.WeightSyncError(f"weight sync: tensor {i} is {name!r} {getattr(t, 'shape', None)} "
                              f"{getattr(t, 'dtype', None)}, its metadata said {m.name!r} {m.shape} {m.dtype}")
    return t.detach().contiguous()


def pack(tensors: Iterator[tuple[str, torch.Tensor]], metas: list[metadata.TensorMeta], places: list[tuple[int, int]],
          buffers: list[torch.Tensor]) -> None:
    """Copy each tensor of ``tensors`` (checked against ``metas``) into its place in ``buffers``, as it comes."""
    for i, (m, (bucket, off)) in enumerate(zip(metas, places)):
        flat = checked(next(tensors, (None, None)), m, i).reshape(-1).view(torch.uint8)
        buffers[bucket][off:off + flat.numel()].copy_(flat)
