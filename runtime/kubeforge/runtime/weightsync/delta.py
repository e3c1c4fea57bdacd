"""Lossless per-tensor deltas: which elements of a tensor changed since a base, encoded as compactly as the count
allows, and applied back bit for bit.

API::

    enc, count = choose(new, base)                  # compare; the cheapest encoding (FULL unless a delta is smaller)
    size = payload_bytes(enc=..., numel=..., count=..., elem=...)   # the one size rule both ends hold each other to
    encode(new, base, enc=enc, count=count, out=payload)            # write the payload (uint8, ``size`` bytes)
    apply(base, enc=enc, count=count, payload=payload)              # base now equals new, bit for bit

Bitwise: tensors are compared and copied as integers of their element's width (int16 for bf16, int32 for float32),
so -0.0 against 0.0, NaN payloads and infinities are changes like any other and arrive exactly as sent. A delta
*sets* elements (it never adds), so applying one twice leaves the same bits.

Payload layouts (``s`` bytes per element, ``n`` elements, ``k`` changed; the values are 8-byte aligned first so
every view is aligned for its dtype):

- ``FULL``: the ``n`` elements (``n*s`` bytes).
- ``INDEX``: the ``k`` new values, padded to 8 bytes, then the ``k`` flat positions (int32; int64 past 2^31 - 1
  elements), ascending.
- ``MASK``: the ``k`` new values, padded to 8 bytes, then one bit per element (little-endian bit order within each
  byte: element ``8j + b`` is bit ``b`` of byte ``j``), ``ceil(n/8)`` bytes.

Neighbours: ``sender`` encodes each tensor of a snapshot against the snapshot it overwrites; ``receiver`` applies
them to its receive buffers (its base); ``metadata`` validates every entry's size with :func:`payload_bytes`.
Pure: no I/O, no collectives.
"""
from __future__ import annotations

import enum

import torch

from kubeforge.runtime.weightsync import protocol

_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_INT32_POSITIONS = (1 << 31) - 1
_BITS = torch.arange(8, dtype=torch.uint8)
_GATHER = 0x0102040810204080   # sum of 2^(56 - 7b), b = 0..7: byte b of a word to bit 56 + b


class Encoding(str, enum.Enum):
    FULL = "full"
    INDEX = "index"
    MASK = "mask"


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as integers of the same width (a flat view, no copy): bitwise comparison and copy."""
    return t.reshape(-1).view(_INTS[t.element_size()])


def _values_bytes(count: int, elem: int) -> int:
    return (count * elem + 7) // 8 * 8


def _position_width(numel: int) -> int:
    return 4 if numel <= _INT32_POSITIONS else 8


def payload_bytes(*, enc: Encoding, numel: int, count: int, elem: int) -> int:
    """Bytes of a payload: the one rule both ends hold each other to."""
    if enc is Encoding.FULL:
        return numel * elem
    if enc is Encoding.INDEX:
        return _values_bytes(count, elem) + count * _position_width(numel)
    return _values_bytes(count, elem) + (numel + 7) // 8


def cheapest(*, numel: int, count: int, elem: int) -> Encoding:
    """The smallest encoding of ``count`` changes among ``numel`` elements; FULL unless a delta is strictly smaller
    (INDEX before MASK on a tie: it applies without unpacking bits)."""
    best = min((Encoding.INDEX, Encoding.MASK),
               key=lambda e: payload_bytes(enc=e, numel=numel, count=count, elem=elem))
    if payload_bytes(enc=best, numel=numel, count=count, elem=elem) < numel * elem:
        return best
    return Encoding.FULL


def changed(new: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Which elements differ in their bits (flat bool)."""
    _same_kind(new, base)
    return torch.ne(bits(new), bits(base))


def choose(new: torch.Tensor, base: torch.Tensor) -> tuple[Encoding, int, torch.Tensor]:
    """(encoding, changed count, changed mask) of ``new`` against ``base``."""
    mask = changed(new, base)
    count = int(torch.count_nonzero(mask))   # a bool tensor's sum() is ~20x slower on CPU
    return cheapest(numel=new.numel(), count=count, elem=new.element_size()), count, mask


def encode(new: torch.Tensor, *, enc: Encoding, count: int, mask: torch.Tensor, out: torch.Tensor) -> None:
    """Write ``new``'s payload into ``out`` (uint8, exactly :func:`payload_bytes` long); ``mask`` and ``count`` as
    :func:`choose` returned them."""
    elem, numel = new.element_size(), new.numel()
    want = payload_bytes(enc=enc, numel=numel, count=count, elem=elem)
    if out.dtype != torch.uint8 or out.numel() != want:
        raise protocol.WeightSyncError(f"weight sync delta: payload buffer of {out.numel()} bytes, {want} needed")
    src = bits(new)
    if enc is Encoding.FULL:
        out.view(src.dtype).copy_(src)
        return
    values = out[:count * elem].view(src.dtype)
    out[count * elem:_values_bytes(count, elem)].zero_()   # the padding: the same bytes every time
    rest = out[_values_bytes(count, elem):]
    if enc is Encoding.INDEX:
        positions = mask.nonzero().reshape(-1)
        torch.index_select(src, 0, positions, out=values)
        rest.view(_INTS[_position_width(numel)]).copy_(positions)
    else:
        values.copy_(src[mask])   # boolean indexing: ~8x faster than masked_select on CPU
        rest.copy_(_pack(mask))


def apply(base: torch.Tensor, *, enc: Encoding, count: int, payload: torch.Tensor) -> None:
    """Make ``base`` (contiguous, in place) equal the tensor the payload was encoded from; WeightSyncError when the
    payload does not fit (a size, a position out of range, a mask whose bits do not count ``count``)."""
    elem, numel = base.element_size(), base.numel()
    want = payload_bytes(enc=enc, numel=numel, count=count, elem=elem)
    if payload.dtype != torch.uint8 or payload.numel() != want or not 0 <= count <= numel:
        raise protocol.WeightSyncError(f"weight sync delta: {enc.value} payload of {payload.numel()} bytes for "
                                       f"{count} of {numel} elements ({want} expected)")
    if not base.is_contiguous():
        raise protocol.WeightSyncError("weight sync delta: the base must be contiguous")
    dst = bits(base)
    if enc is Encoding.FULL:
        dst.copy_(payload.view(dst.dtype))
        return
    if count == 0:
        return
    values = payload[:count * elem].view(dst.dtype)
    rest = payload[_values_bytes(count, elem):]
    if enc is Encoding.INDEX:
        positions = rest.view(_INTS[_position_width(numel)]).long()
        if int(positions.min()) < 0 or int(positions.max()) >= numel:
            raise protocol.WeightSyncError(f"weight sync delta: a position outside 0..{numel - 1}")
        dst.index_copy_(0, positions, values)
    else:
        mask = _unpack(rest, numel)
        if (got := int(torch.count_nonzero(mask))) != count:
            raise protocol.WeightSyncError(f"weight sync delta: the mask sets {got} bits, {count} said")
        dst.masked_scatter_(mask, values)


def _pack(mask: torch.Tensor) -> torch.Tensor:
    """One bit per element, element ``8j + b`` in bit ``b`` of byte ``j``: each run of 8 mask bytes (0 or 1), read as
    one little-endian int64, times ``_GATHER`` has byte ``b`` in bit ``56 + b`` and nothing else in bits 56..63 (no
    two partial products share a bit, so nothing carries): three passes over n/8 words instead of eight over n
    bytes."""
    flat = mask.reshape(-1).view(torch.uint8)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    elif flat.storage_offset() % 8:
        flat = flat.clone()
    words = flat.view(torch.int64)
    return ((words * _GATHER) >> 56).bitwise_and_(0xFF).to(torch.uint8)   # the product wraps: bits > 63 go


def _unpack(packed: torch.Tensor, numel: int) -> torch.Tensor:
    shifts = _BITS.to(packed.device)
    return ((packed.unsqueeze(1) >> shifts) & 1).reshape(-1)[:numel].bool()


def _same_kind(new: torch.Tensor, base: torch.Tensor) -> None:
    if new.shape != base.shape or new.dtype != base.dtype:
        raise protocol.WeightSyncError(f"weight sync delta: {tuple(new.shape)} {new.dtype} against a base of "
                                       f"{tuple(base.shape)} {base.dtype}")
