"""What a receiver must know of the tensors before they arrive: the metadata message, and the streams that carry it.

The metadata is JSON bytes in a uint8 tensor (names, shapes, dtypes, bucket and offset of each tensor), never pickle;
:func:`decode_meta` validates all of it (bounds, dtypes, every tensor inside its bucket, every bucket exactly as large
as its tensors) before anything is allocated; :func:`decode_sync_meta` also the delta a sync may offer (``Offer``:
each tensor's encoding, count and place in the delta's own buckets, sized by ``delta.payload_bytes``). A ``TensorStream`` produces named tensors lazily, described up front by
its ``meta`` (the sharded trainer gathers each one only when its bucket is packed); :func:`as_stream` makes one of
tensors already in memory.

Neighbours: ``sender`` plans a sync from a stream's meta and encodes it; ``receiver`` decodes it; ``bucketing`` checks
each tensor against its meta as it is packed.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from kubeforge.runtime.weightsync import delta, protocol


@dataclasses.dataclass(frozen=True)
class Offer:
    """A delta offered against the receivers' ``base`` version: its payload's bucket sizes (buckets back to back in
    one flat buffer); each tensor's entry says its encoding, changed count and place (``dbucket`` -1: no bytes)."""

    base: int
    buckets: list[int]


def encode_meta(*, version: int, entries: list[dict[str, Any]], bucket_sizes: list[int],
                offer: Offer | None = None) -> bytes:
    doc: dict[str, Any] = {"version": version, "tensors": entries, "buckets": bucket_sizes}
    if offer is not None:
        doc["delta"] = {"base": offer.base, "buckets": offer.buckets}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_meta(raw: bytes) -> tuple[int, list[dict[str, Any]], list[int]]:
    """Parse and validate the metadata message; raise WeightSyncError naming what is wrong."""
    version, entries, buckets, _ = decode_sync_meta(raw)
    return version, entries, buckets


def decode_sync_meta(raw: bytes) -> tuple[int, list[dict[str, Any]], list[int], Offer | None]:
    """:func:`decode_meta` plus the delta offered with it (None: a full sync), validated as strictly."""
    try:
        doc = json.loads(raw.decode())
        version, entries, buckets = int(doc["version"]), list(doc["tensors"]), [int(b) for b in doc["buckets"]]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise protocol.WeightSyncError(f"weight sync: malformed metadata: {e}") from e
    _check_full(entries, buckets)
    return version, entries, buckets, _offer(doc.get("delta"), entries) if "delta" in doc else None


def _check_full(entries: list[Any], buckets: list[int]) -> None:
    if len(entries) > protocol.MAX_TENSORS or len(buckets) > len(entries):
        raise protocol.WeightSyncError(f"weight sync: {len(entries)} tensors in {len(buckets)} buckets exceed the "
                                       f"bounds ({protocol.MAX_TENSORS} tensors, every bucket holding at least one)")
    extent = [0] * len(buckets)
    for i, entry in enumerate(entries):
        if (not isinstance(entry, dict) or not isinstance(entry.get("name"), str)
                or len(entry["name"]) > protocol.MAX_NAME_CHARS or not isinstance(entry.get("shape"), list)
                or len(entry["shape"]) > protocol.MAX_DIMS or any(type(d) is not int or d < 0 for d in entry["shape"])):
            raise protocol.WeightSyncError(f"weight sync: metadata entry {i} has a bad name or shape")
        try:
            numel = 1
            for d in entry["shape"]:
                numel *= int(d)
            nbytes = numel * torch.empty((), dtype=protocol.DTYPES[entry["dtype"]]).element_size()
            off = entry["offset"]
            ok = (isinstance(entry["name"], str) and 0 <= entry["bucket"] < len(buckets)
                  and off % protocol.ALIGN == 0 and 0 <= off and off + nbytes <= buckets[entry["bucket"]])
        except (KeyError, TypeError, ValueError) as err:
            raise protocol.WeightSyncError(f"weight sync: malformed metadata entry {i}: {err}") from err
        if not ok:
            raise protocol.WeightSyncError(f"weight sync: metadata entry {i} ({entry.get('name')!r}) is out of bounds")
        extent[entry["bucket"]] = max(extent[entry["bucket"]], off + nbytes)
    if extent != buckets:   # a bucket is exactly as large as the tensors placed in it: no allocation beyond them
        raise protocol.WeightSyncError(f"weight sync: bucket sizes {buckets[:8]} do not match their tensors "
                                       f"{extent[:8]}")


def _offer(doc: Any, entries: list[dict[str, Any]]) -> Offer:
    """The delta part of the metadata: every payload inside its bucket, every size by ``delta.payload_bytes``, every
    bucket exactly as large as its payloads."""
    try:
        base, buckets = int(doc["base"]), [int(b) for b in doc["buckets"]]
    except (ValueError, KeyError, TypeError) as e:
        raise protocol.WeightSyncError(f"weight sync: malformed delta metadata: {e}") from e
    if base < 0 or len(buckets) > len(entries) or any(b <= 0 for b in buckets):
        raise protocol.WeightSyncError(f"weight sync: delta metadata out of bounds (base {base}, buckets "
                                       f"{buckets[:8]})")
    extent = [0] * len(buckets)
    for i, entry in enumerate(entries):
        try:
            size = payload_size(entry)
            dbucket, doffset = entry["dbucket"], entry["doffset"]
            ok = (type(dbucket) is int and type(doffset) is int and (
                (size == 0 and dbucket == -1) or (0 <= dbucket < len(buckets) and doffset % protocol.ALIGN == 0
                                                  and 0 <= doffset and doffset + size <= buckets[dbucket])))
        except (KeyError, TypeError, ValueError) as err:
            raise protocol.WeightSyncError(f"weight sync: malformed delta entry {i}: {err}") from err
        if not ok:
            raise protocol.WeightSyncError(f"weight sync: delta entry {i} ({entry.get('name')!r}) is out of bounds")
        if size:
            extent[dbucket] = max(extent[dbucket], doffset + size)
    if extent != buckets:
        raise protocol.WeightSyncError(f"weight sync: delta bucket sizes {buckets[:8]} do not match their payloads "
                                       f"{extent[:8]}")
    return Offer(base=base, buckets=buckets)


def payload_size(entry: dict[str, Any]) -> int:
    """Bytes of an (already validated) entry's delta payload; ValueError/KeyError/TypeError when its fields are bad."""
    elem = torch.empty((), dtype=protocol.DTYPES[entry["dtype"]]).element_size()
    numel = math.prod(entry["shape"])
    count = entry["count"]
    if type(count) is not int or not 0 <= count <= numel:
        raise ValueError(f"count {count!r} outside 0..{numel}")
    return delta.payload_bytes(enc=delta.Encoding(entry["enc"]), numel=numel, count=count, elem=elem)


@runtime_checkable
class TensorMeta(Protocol):
    """What a receiver must know of a tensor before it arrives."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> torch.dtype: ...


@runtime_checkable
class TensorStream(Protocol):
    """Named tensors produced lazily, described up front by ``meta`` (same order, same names, shapes, dtypes)."""

    @property
    def meta(self) -> Sequence[TensorMeta]: ...
    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]: ...


@dataclasses.dataclass(frozen=True)
class _Meta:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class _ListStream:
    """A ``TensorStream`` over tensors already in memory."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.tensors = tensors
        self.meta = [_Meta(n, tuple(t.shape), t.dtype) for n, t in tensors]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.tensors)


def _unique(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Detached, contiguous CPU/GPU tensors; a tensor sharing storage with an earlier one (a tied weight) is
    sent once, under its first name."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = []
    for name, t in named:
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen:
            continue
        seen.add(key)
        out.append((name, t.detach().contiguous()))
    return out


def as_stream(named: Iterable[tuple[str, torch.Tensor]] | TensorStream) -> TensorStream:
    """``named`` when it is a ``TensorStream``, else a stream over its tensors as listed (a tied weight once)."""
    return named if isinstance(named, TensorStream) else _ListStream(_unique(named))


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in protocol.DTYPE_NAMES:
        raise protocol.WeightSyncError(f"weight sync: dtype {dtype} cannot be sent")
    return protocol.DTYPE_NAMES[dtype]


def nbytes(m: TensorMeta) -> int:
    return math.prod(m.shape) * torch.empty((), dtype=m.dtype).element_size()
