"""Free blocks of loopback ports, one block of ``contract.PORTS_PER_PROCESS`` per local process.

Invariant: a block is handed out only if every port in it could be bound at that moment (a race with other
programs stays possible; the roles then fail to bind and the launcher's restart policy takes over).
"""
from __future__ import annotations

import random
import socket

from kubeforge.api import contract

LOW, HIGH = 20000, 60000


def _free(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def allocate(count: int, *, host: str = "127.0.0.1", rng: random.Random | None = None,
             blocks: int = 1) -> list[int]:
    """``count`` distinct port bases whose whole spans of ``blocks`` blocks are free now (a trainer "pod" with N
    ranks needs N consecutive blocks)."""
    rng = rng or random.Random()
    width = contract.PORTS_PER_PROCESS * blocks
    bases: list[int] = []
    for _ in range(10000):
        if len(bases) == count:
            return bases
        base = rng.randrange(LOW, HIGH - width, width)
        if any(abs(base - b) < width for b in bases):
            continue
        if all(_free(base + i, host) for i in range(width)):
            bases.append(base)
    raise RuntimeError(f"could not find {count} free blocks of {width} ports on {host}")
