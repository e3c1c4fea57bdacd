"""Resident adapters of a pool engine (``generator.pool.adapters``): ids drawn per (job, version), LRU eviction of
idle adapters only, swaps counted and timed per job, a replaced version unloaded once idle."""
from __future__ import annotations

import pytest

from kubeforge.runtime.generator.pool import adapters


class FakeEngine:
    """An engine's LoRA slots: records loads and unloads, refuses more than ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.loaded: dict[int, adapters.Adapter] = {}
        self.log: list[tuple[str, str]] = []

    def load(self, a: adapters.Adapter) -> None:
        assert a.lora_id not in self.loaded
        assert len(self.loaded) < self.capacity, "engine over capacity"
        self.loaded[a.lora_id] = a
        self.log.append(("load", a.name))

    def unload(self, a: adapters.Adapter) -> None:
        del self.loaded[a.lora_id]
        self.log.append(("unload", a.name))


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def slots(capacity: int) -> tuple[adapters.Slots, FakeEngine]:
    eng = FakeEngine(capacity)
    return adapters.Slots(capacity=capacity, backend=eng, clock=Clock()), eng


def test_ids_are_drawn_per_job_and_version_and_a_job_reaches_only_its_own() -> None:
    s, eng = slots(2)
    assert s.acquire("a") is None              # nothing pushed yet: the base model (policy v0)
    a1 = s.publish("a", version=1, path="/x/a/v1")
    b1 = s.publish("b", version=1, path="/x/b/v1")
    a2 = s.publish("a", version=2, path="/x/a/v2")
    assert len({a1.lora_id, b1.lora_id, a2.lora_id}) == 3
    got = s.acquire("a")
    assert got == a2 and got.job == "a"       # the newest version of a's own adapter, never b's
    s.release(got)
    assert s.acquire("b") == b1
    again = s.publish("a", version=1, path="/x/a/v1")     # a resumed trainer pushes an older version: a new id
    assert again.lora_id not in {a1.lora_id, b1.lora_id, a2.lora_id} and s.current["a"] == again


def test_lru_evicts_the_least_recently_used_idle_adapter_and_counts_the_swap() -> None:
    s, eng = slots(2)
    for job in "abc":
        s.publish(job, version=1, path=f"/x/{job}")
    for job in "ab":
        s.release(s.acquire(job))
    s.release(s.acquire("a"))                 # a used last: b is the least recently used
    s.release(s.acquire("c"))                 # full: evicts b
    assert [x.job for x in s.resident()] == ["a", "c"]
    assert ("unload", "b-v1") in eng.log
    assert s.stats["c"].loads == 1 and s.stats["c"].swaps == 1 and s.stats["c"].swap_seconds == pytest.approx(0.5)
    assert s.stats["a"].swaps == 0 and s.stats["b"].swaps == 0


def test_an_adapter_in_flight_is_never_evicted() -> None:
    s, eng = slots(1)
    s.publish("a", version=1, path="/a")
    s.publish("b", version=1, path="/b")
    held = s.acquire("a")
    with pytest.raises(adapters.NoSlot):
        s.acquire("b")
    s.release(held)
    assert s.acquire("b") is not None and [x.job for x in s.resident()] == ["b"]


def test_a_replaced_version_goes_when_its_last_request_is_released() -> None:
    s, eng = slots(2)
    s.publish("a", version=1, path="/a1")
    held = s.acquire("a")
    s.publish("a", version=2, path="/a2")       # pushed while v1 samples
    assert [x.version for x in s.resident()] == [1]
    s.release(held)
    assert s.resident() == []                    # v1 unloaded at release; v2 loads at its first use
    s.release(s.acquire("a"))
    assert [x.version for x in s.resident()] == [2]
    s.drop("a")
    assert s.resident() == [] and s.acquire("a") is None


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        adapters.Slots(capacity=0, backend=FakeEngine(1))
