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
    out: list[tuple[int, int]] = []
    bucket, used = -1, 0
    for size in sizes:
        start = _aligned(used)
        if bucket < 0 or start + size > bucket_bytes:
            bucket, start = bucket + 1, 0
        out.append((bucket, start))
        used = start + size
    return out


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
            members.append((_checked(next(tensors, (None, None)), metas[i], i).to(staging.device), places[i][1]))
            i += 1
        if len(members) == 1 and members[0][1] == 0:
            yield members[0][0].reshape(-1).view(torch.uint8)
            continue
        buf = staging[:size]
        for t, off in members:
            flat = t.reshape(-1).view(torch.uint8)
            buf[off:off + flat.numel()].copy_(flat)
        yield buf


def _checked(item: tuple[str | None, torch.Tensor | None], m: metadata.TensorMeta, i: int) -> torch.Tensor:
    name, t = item
    if t is None or name != m.name or tuple(t.shape) != tuple(m.shape) or t.dtype != m.dtype:
        raise protocol.WeightSyncError(f"weight sync: tensor {i} is {name!r} {getattr(t, 'shape', None)} "
                              f"{getattr(t, 'dtype', None)}, its metadata said {m.name!r} {m.shape} {m.dtype}")
    return t.detach().contiguous()


def pack(tensors: Iterator[tuple[str, torch.Tensor]], metas: list[metadata.TensorMeta], places: list[tuple[int, int]],
          buffers: list[torch.Tensor]) -> None:
    """Copy each tensor of ``tensors`` (checked against ``metas``) into its place in ``buffers``, as it comes."""
    for i, (m, (bucket, off)) in enumerate(zip(metas, places)):
        flat = _checked(next(tensors, (None, None)), m, i).reshape(-1).view(torch.uint8)
        buffers[bucket][off:off + flat.numel()].copy_(flat)
