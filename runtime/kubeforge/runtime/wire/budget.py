"""What unpacking a msgpack payload would cost in Python memory, computed before unpacking it.

Neighbours: ``codec.decode`` calls :func:`check` on every payload larger than ``WALK_ABOVE`` bytes before handing it
to ``msgpack.unpackb``; small payloads are bounded by ``unpackb``'s own length limits (their worst case, ~72 bytes of
objects per payload byte, stays a few MB).

Why: one byte of msgpack can become a 64-byte Python object (``0x80`` is an empty map), so a 64 MiB frame of empty
maps would need gigabytes. The walk reads only headers (strings and binaries are skipped by length, not copied) and
charges each item what CPython would allocate for it (list/dict slots, float and int objects, str/bytes headers);
the payload is refused as soon as the total passes ``ratio`` times its size plus ``SLACK``, or as soon as nesting passes
``MAX_DEPTH`` or the item count ``MAX_ITEMS``. Ext types and the reserved byte are refused outright (never ours).

Invariants: :func:`check` either returns the estimate or raises :class:`Refused` with a short reason; it never
allocates in proportion to the payload (an explicit stack of at most ``MAX_DEPTH`` entries) and visits at most
``MAX_ITEMS`` items.
"""
from __future__ import annotations

import struct

WALK_ABOVE = 256 << 10        # bytes; below this the walk costs more than it protects
RATIO = 2.5                   # decoded objects may cost at most this many times the payload's size ...
SLACK = 64 << 20              # ... plus this: 100k tiny prompts (a legitimate WORK of ~3 MB) decode to ~50 MB
MAX_DEPTH = 16                # our deepest message nests 5 levels
MAX_ITEMS = 1_500_000         # a legitimate frame holds at most ~1M items (100k prompts of 3 fields)

# CPython object sizes (64-bit): what one decoded item costs beyond the slot its container already paid for.
_LIST, _DICT, _DICT_ENTRY, _SLOT = 56, 64, 48, 8
_FLOAT, _INT, _STR, _BYTES = 24, 32, 49, 33

_U8, _U16, _U32 = struct.Struct(">B"), struct.Struct(">H"), struct.Struct(">I")


class Refused(ValueError):
    """The payload would cost too much to decode (or is not msgpack we speak)."""


# One entry per type byte: (action, payload size or length width, cost).
_FREE, _SCALAR, _SIZED, _FIXSTR, _FIXMAP, _FIXARRAY, _MAP, _ARRAY, _BAD = range(9)


def _table() -> list[tuple[int, int, int]]:
    t = [(_BAD, 0, 0)] * 256
    for b in range(256):
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            t[b] = (_FREE, 0, 0)          # small ints, nil, bools: cached singletons
        elif b <= 0x8F:
            t[b] = (_FIXMAP, b & 0x0F, 0)
        elif b <= 0x9F:
            t[b] = (_FIXARRAY, b & 0x0F, 0)
        elif b <= 0xBF:
            t[b] = (_FIXSTR, b & 0x1F, _STR + (b & 0x1F))
    for b, width, cost in ((0xC4, 1, _BYTES), (0xC5, 2, _BYTES), (0xC6, 4, _BYTES),
                           (0xD9, 1, _STR), (0xDA, 2, _STR), (0xDB, 4, _STR)):
        t[b] = (_SIZED, width, cost)
    t[0xCA], t[0xCB] = (_SCALAR, 4, _FLOAT), (_SCALAR, 8, _FLOAT)
    for b in range(0xCC, 0xD4):
        t[b] = (_SCALAR, 1 << ((b - 0xCC) & 3), _INT)
    t[0xDC], t[0xDD], t[0xDE], t[0xDF] = (_ARRAY, 2, 0), (_ARRAY, 4, 0), (_MAP, 2, 0), (_MAP, 4, 0)
    return t


_TABLE = _table()


def check(data: bytes | bytearray | memoryview, *, ratio: float = RATIO, slack: int = SLACK) -> int:
    """The estimated bytes of Python objects ``msgpack.unpackb(data)`` would allocate; :class:`Refused` when that
    passes ``ratio * len(data) + slack``, nesting passes ``MAX_DEPTH`` or the items ``MAX_ITEMS``."""
    buf = data if isinstance(data, bytes) else memoryview(data).cast("B")   # never a copy
    n = len(buf)
    budget = ratio * n + slack
    table = _TABLE
    cost = 0
    left_items = MAX_ITEMS
    pos = 0
    stack: list[int] = []      # items still to read in each open container
    remaining = 1              # the top level is one item
    while True:
        while remaining == 0:
            if not stack:
                if pos != n:
                    raise Refused(f"{n - pos} trailing bytes")
                return cost
            remaining = stack.pop()
        remaining -= 1
        left_items -= 1
        if left_items < 0:
            raise Refused(f"more than {MAX_ITEMS} items")
        if pos >= n:
            raise Refused("truncated")
        action, size, item_cost = table[buf[pos]]
        pos += 1
        if action == _FREE:
            continue
        if action == _SCALAR or action == _FIXSTR:
            pos += size
            cost += item_cost
        elif action == _SIZED:
            length = _length(buf, pos, size, n)
            pos += size + length
            cost += item_cost + length
        elif action == _BAD:
            raise Refused(f"type byte 0x{buf[pos - 1]:02x} (ext or reserved) is not part of the schema")
        else:
            if action == _FIXMAP or action == _FIXARRAY:
                count = size
            else:
                count = _length(buf, pos, size, n)
                pos += size
            is_map = action == _FIXMAP or action == _MAP
            if count > n - pos:            # every item needs at least one byte
                raise Refused(f"container of {count} items in {n - pos} bytes")
            cost += (_DICT + _DICT_ENTRY * count) if is_map else (_LIST + _SLOT * count)
            if count:
                if len(stack) >= MAX_DEPTH:
                    raise Refused(f"nesting deeper than {MAX_DEPTH}")
                stack.append(remaining)
                remaining = count * 2 if is_map else count
        if pos > n:
            raise Refused("truncated")
        if cost > budget:
            raise Refused(f"decoding would allocate over {ratio:g}x the payload's {n} bytes + {slack >> 20} MiB")


def _length(buf: bytes | memoryview, pos: int, width: int, n: int) -> int:
    if pos + width > n:
        raise Refused("truncated")
    fmt = _U8 if width == 1 else _U16 if width == 2 else _U32
    return int(fmt.unpack_from(buf, pos)[0])
