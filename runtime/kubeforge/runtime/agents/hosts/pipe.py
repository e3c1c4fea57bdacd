"""Length-prefixed msgpack frames over a pipe: what the environment host and its workers say to each other.

A frame is a u32 little-endian length and that many bytes of msgpack (plain maps, lists, strings, numbers: never
pickle). Reads are bounded in time (a deadline) and in size (``max_bytes``: a longer frame is refused unread).
"""
from __future__ import annotations

import os
import select
import struct
import time
from typing import Any

import msgpack

LENGTH = struct.Struct("<I")


class Closed(EOFError):
    """The other side closed the pipe (or died)."""


class Overrun(ValueError):
    """A frame longer than the reader's bound."""


class Late(TimeoutError):
    """No whole frame before the deadline."""


def write(fd: int, value: Any) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    view = memoryview(LENGTH.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read(fd: int, *, deadline: float | None, max_bytes: int) -> Any:
    """The next frame's value; ``Late`` at the deadline (None: wait), ``Overrun`` above ``max_bytes``."""
    (size,) = LENGTH.unpack(_exact(fd, LENGTH.size, deadline))
    if size > max_bytes:
        raise Overrun(f"a frame of {size} bytes exceeds {max_bytes}")
    return msgpack.unpackb(_exact(fd, size, deadline), raw=False, strict_map_key=False)


def _exact(fd: int, n: int, deadline: float | None) -> bytes:
    parts, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise Late("no answer before the deadline")
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise Closed("the pipe closed")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)
