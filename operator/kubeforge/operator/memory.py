"""The operator process's C heap: few malloc arenas, and freed memory handed back to the system now and then.

Role: ``main`` calls :func:`limit_arenas` first thing (before any thread starts) and :func:`trim` every
``TRIM_EVERY_S`` while it runs. Neighbours: none (process-wide allocator settings).

Why: the operator runs ~100 threads (``--workers`` reconcile threads, twice as many appliers, the API client's
connections). glibc gives threads malloc arenas of their own, up to 8 per core, and a freed chunk stays in its
arena: every JSON response, rendered object and parsed pod a pass builds and drops is freed into whichever arena
its thread used, and each arena keeps its own high-water mark. Measured with the bench at 300 RLJobs
(docs/benchmarks.md, "Operator at scale"): most of the operator's resident memory was glibc arenas and Python
arenas, not live objects (tracemalloc counted ~50 MiB live of ~250 MiB resident). Two arenas bound the copies;
the reconcile threads wait on the API server most of the time, so they rarely contend for a lock.
``malloc_trim(0)`` also returns free pages inside the heaps (not only at their top).

Only on glibc; elsewhere nothing happens. A ``MALLOC_ARENA_MAX`` in the environment is the user's explicit
choice and is left alone.

Imports: kopf imports the ``kubernetes`` (and ``pykube``) client when installed, only to recognise their model
objects and to borrow their credentials. The operator hands kopf plain dicts and its own credentials (a login
handler), so :func:`skip_unused_imports`, called by ``entry`` before kopf is imported, keeps them out: ~5 MiB of
resident memory for the life of the process. Only the operator process does this (tests import both freely).
"""
from __future__ import annotations

import ctypes
import functools
import os
import sys

M_ARENA_MAX = -8            # glibc <malloc.h>
ARENAS = 2
ENV = "MALLOC_ARENA_MAX"
TRIM_EVERY_S = 30.0
UNUSED_IMPORTS = ("kubernetes", "pykube")


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None


def limit_arenas() -> bool:
    """Cap glibc's malloc arenas at ``ARENAS`` for this process; True when set, False when the C library is not
    glibc or the environment already chose a cap. Call it before threads start: arenas made before stay."""
    if ENV in os.environ:
        return False
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "mallopt") and libc.mallopt(M_ARENA_MAX, ARENAS))


def trim() -> bool:
    """Hand free heap memory back to the system; True when some was released."""
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "malloc_trim") and libc.malloc_trim(0))


def skip_unused_imports() -> list[str]:
    """Make ``UNUSED_IMPORTS`` unimportable in this process (an import raises ImportError, which kopf expects of
    an optional client) unless already imported; returns the names blocked. Call it before kopf's import."""
    out = [name for name in UNUSED_IMPORTS if name not in sys.modules]
    for name in out:
        sys.modules[name] = None  # type: ignore[assignment]
    return out
