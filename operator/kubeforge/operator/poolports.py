"""The port block each job attached to a GeneratorPool is served at: assigned by a pool pass, pure.

Role: a pool engine serves every attached job on a socket of that job's own (docs/generator-pool.md, "Keys and
isolation"), so every engine pod listens on one block of ``contract.PORTS_PER_PROCESS`` ports per job besides its
own block at ``contract.DEFAULT_PORT_BASE`` (metrics, probes). Slot ``s`` is the block starting at
``DEFAULT_PORT_BASE + PORTS_PER_PROCESS * (s + 1)``; every engine of the pool serves a job at the same port base
(they are different pods), which the job's roles list in ``KUBEFORGE_PEERS_GENERATOR``.

Neighbours: ``poolreconcile`` reads the previous assignment from the pool's ``status.jobPorts`` (``previous``),
calls :func:`assign` and writes the result back there; a job's pass reads its own port base from the same field
(:func:`port_base_of`) and holds its pods until it has one; ``render.pool`` writes the blocks into the engines'
jobs file.

Invariants of :func:`assign`: a job keeps its block for as long as it is attached (whatever attaches or leaves
meanwhile); no two jobs share a block; a job that leaves frees its block for the next newcomer; newcomers take the
lowest free blocks in name order, so the same (previous, attached) gives the same answer on every pass and every
replica of the operator; a job beyond the ports there are gets none (it is held, not served on a port of another).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubeforge.api import contract

#: The highest port a block may reach (its last port is ``base + PORTS_PER_PROCESS - 1``).
MAX_PORT = 65535
#: How many job blocks fit above the engine's own block.
CAPACITY = (MAX_PORT + 1 - contract.DEFAULT_PORT_BASE) // contract.PORTS_PER_PROCESS - 1


def base(slot: int) -> int:
    """The first port of job slot ``slot`` (0-based; the engine's own block comes before slot 0)."""
    return contract.DEFAULT_PORT_BASE + contract.PORTS_PER_PROCESS * (slot + 1)


def slot(port_base: int, *, capacity: int = CAPACITY) -> int | None:
    """The slot whose block starts at ``port_base``; None when no slot does (a record that is not one of ours)."""
    off = port_base - contract.DEFAULT_PORT_BASE
    s = off // contract.PORTS_PER_PROCESS - 1
    return s if off % contract.PORTS_PER_PROCESS == 0 and 0 <= s < capacity else None


def previous(status: Mapping[str, Any] | None) -> dict[str, int]:
    """``{job: port base}`` as a pool's raw ``status.jobPorts`` records it (entries that are not well formed are
    skipped: the pass then assigns those jobs afresh)."""
    out: dict[str, int] = {}
    for e in (status or {}).get("jobPorts") or ():
        if isinstance(e, Mapping) and isinstance(e.get("name"), str) and isinstance(e.get("portBase"), int):
            out.setdefault(e["name"], e["portBase"])
    return out


def assign(previous: Mapping[str, int], attached: Iterable[str], *, capacity: int = CAPACITY) -> dict[str, int]:
    """``{job: port base}`` for every job of ``attached`` a block is left for (see the module's invariants)."""
    jobs = sorted(set(attached))
    taken: dict[int, str] = {}
    for job in jobs:     # keep what each job had, first come in name order should a record be doubled
        s = slot(previous[job], capacity=capacity) if job in previous else None
        if s is not None and s not in taken:
            taken[s] = job
    kept = {job: s for s, job in taken.items()}
    free = (s for s in range(capacity) if s not in taken)
    out = {job: base(kept[job]) for job in kept}
    for job in jobs:
        if job not in kept:
            s = next(free, None)
            if s is None:
                break
            out[job] = base(s)
    return dict(sorted(out.items()))


def port_base_of(pool: Mapping[str, Any], job: str) -> int | None:
    """The port base a pool (its raw body) has given ``job``; None while it has given none."""
    return previous(pool.get("status")).get(job)

