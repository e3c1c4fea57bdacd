"""Which jobs' adapters are resident in a pool engine: at most ``maxAdapters``, least recently used evicted first.

Role: the pool engine's loop (``generator.pool.serve``) :meth:`Slots.publish`\\ es each adapter version a job's
trainer pushed, :meth:`Slots.acquire`\\ s a job's current adapter before sampling with it and releases it after.
The engine side is behind :class:`Backend` (``generator.pool.engine`` over vLLM's ``add_lora``/``remove_lora``; an
in-process fake in unit tests).

Invariants:
- Identity: every (job, version) gets a ``lora_id`` drawn here, from one counter, never reused and never taken
  from the wire; a job reaches only its own current adapter (``acquire(job)``), so no request can be sampled with
  another job's adapter nor an older version of its own.
- At most ``capacity`` adapters are loaded at once. Making one resident when all slots are taken evicts the least
  recently used adapter with nothing in flight; when every resident adapter is in flight, :class:`NoSlot` is
  raised (the caller serves the others first; with one batch at a time this cannot happen for ``capacity >= 1``).
- A push replaces the job's previous adapter (whatever the versions: a trainer resumed from a checkpoint pushes
  an older one): the previous one is unloaded at once when idle, or when its last request is released.
- Counted per job: ``loads`` (an adapter loaded), ``swaps`` (a load that had to evict another adapter: the price
  of sharing more jobs than slots) and ``swap_seconds`` (their wall time, unload plus load; the clock injected).
"""
from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Adapter:
    job: str
    version: int
    lora_id: int
    path: str

    @property
    def name(self) -> str:
        """vLLM's name of the adapter (logs only: vLLM addresses adapters by ``lora_id``)."""
        return f"{self.job}-v{self.version}"


class Backend(Protocol):
    def load(self, adapter: Adapter) -> None:
        """Make ``adapter`` resident in the engine."""

    def unload(self, adapter: Adapter) -> None:
        """Drop ``adapter`` from the engine."""


class NoSlot(RuntimeError):
    """Every slot holds an adapter with requests in flight."""


@dataclasses.dataclass
class JobStats:
    loads: int = 0
    swaps: int = 0
    swap_seconds: float = 0.0


class Slots:
    """The resident adapters of one engine (see the module docstring)."""

    def __init__(self, *, capacity: int, backend: Backend, clock: Callable[[], float] = time.monotonic,
                 on_swap: Callable[[str, float], None] = lambda job, seconds: None) -> None:
        if capacity < 1:
            raise ValueError(f"adapter slots: capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.backend = backend
        self.clock = clock
        self.on_swap = on_swap
        self._next_id = 1
        self.current: dict[str, Adapter] = {}                   # job -> its newest adapter
        self._resident: collections.OrderedDict[int, Adapter] = collections.OrderedDict()   # LRU first
        self._in_flight: collections.Counter[int] = collections.Counter()
        self.stats: dict[str, JobStats] = collections.defaultdict(JobStats)

    def resident(self) -> list[Adapter]:
        """The loaded adapters, least recently used first."""
        return list(self._resident.values())

    def publish(self, job: str, *, version: int, path: str) -> Adapter:
        """``job``'s trainer pushed ``version`` (written at ``path``): it becomes the job's adapter."""
        old = self.current.get(job)
        new = Adapter(job=job, version=version, lora_id=self._next_id, path=path)
        self._next_id += 1
        self.current[job] = new
        if old is not None:
            self._unload_if_idle(old)
        return new

    def acquire(self, job: str) -> Adapter | None:
        """``job``'s current adapter, resident and counted in flight until :meth:`release`; None while the job has
        pushed none (its policy v0 is the base model)."""
        a = self.current.get(job)
        if a is None:
            return None
        if a.lora_id in self._resident:
            self._resident.move_to_end(a.lora_id)
        else:
            self._load(a)
        self._in_flight[a.lora_id] += 1
        return a

    def release(self, adapter: Adapter | None) -> None:
        if adapter is None:
            return
        self._in_flight[adapter.lora_id] -= 1
        if self._in_flight[adapter.lora_id] <= 0:
            del self._in_flight[adapter.lora_id]
            if self.current.get(adapter.job) != adapter:    # replaced while in flight
                self._unload_if_idle(adapter)

    def drop(self, job: str) -> None:
        """``job`` detached: its adapter goes (now when idle, else at its release)."""
        a = self.current.pop(job, None)
        if a is not None:
            self._unload_if_idle(a)

    def _load(self, a: Adapter) -> None:
        started = self.clock()
        evicted = False
        while len(self._resident) >= self.capacity:
            victim = next((x for x in self._resident.values() if x.lora_id not in self._in_flight), None)
            if victim is None:
                raise NoSlot(f"adapter slots: all {self.capacity} resident adapters have requests in flight")
            self._unload(victim)
            evicted = True
        self.backend.load(a)
        self._resident[a.lora_id] = a
        st = self.stats[a.job]
        st.loads += 1
        if evicted:
            seconds = self.clock() - started
            st.swaps += 1
            st.swap_seconds += seconds
            self.on_swap(a.job, seconds)

    def _unload_if_idle(self, a: Adapter) -> None:
        if a.lora_id in self._resident and a.lora_id not in self._in_flight:
            self._unload(a)

    def _unload(self, a: Adapter) -> None:
        self.backend.unload(a)
        del self._resident[a.lora_id]
