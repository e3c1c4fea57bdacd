"""The skewed-lengths partial-rollouts bench, its pure parts and harness (bench/skewed.py): the length mixture, the
idle accounting, the step-cost interpolation, and both generator loops driven by the stand-in trainer over the
simulated engine (``skewed.Simulated``) at a step cost the same at any batch (so engine steps measure time). The
bench itself needs vLLM (docs/benchmarks.md)."""
from __future__ import annotations

import pathlib
import statistics
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:     # a bench helper, imported as the bench scripts import it
    sys.path.insert(0, str(ROOT / "bench"))

import skewed  # noqa: E402

from kubeforge.runtime import types  # noqa: E402
from kubeforge.runtime.generator import stepper  # noqa: E402


def fake(skew: skewed.Skew, *, sleep: float = 0.0) -> skewed.Simulated:
    """The simulated engine on the skew's lengths, a flat step cost of 0.01 s."""

    def length(request_id: str) -> int:
        key, sample = skewed.request_key(request_id)
        return skew.length(key=key, sample=sample)

    return skewed.Simulated(length=length, sleep=sleep)


# ---------------------------------------------------------------- lengths


def test_lengths_are_skewed_bounded_and_repeatable() -> None:
    skew = skewed.Skew(max_new_tokens=128, long_fraction=1 / 16, seed=3)
    draws = [skew.length(key=k, sample=i) for k in range(1, 2501) for i in range(8)]
    assert draws == [skew.length(key=k, sample=i) for k in range(1, 2501) for i in range(8)]
    assert min(draws) >= 1 and max(draws) <= 128
    long = [d for d in draws if d >= skew.long_min]
    short = [d for d in draws if d < skew.long_min]
    assert all(d <= skew.short_max == 16 for d in short) and skew.long_min == 96
    assert abs(len(long) / len(draws) - 1 / 16) < 0.01          # 20,000 draws: a few standard errors
    assert abs(statistics.fmean(draws) - skew.mean()) < 0.03 * skew.mean()
    assert statistics.median(draws) <= 16 < max(draws)           # most short, a few near the cap
    other = skewed.Skew(max_new_tokens=128, long_fraction=1 / 16, seed=4)
    assert draws[:200] != [other.length(key=k, sample=i) for k in range(1, 26) for i in range(8)]


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_new_tokens=4), "max_new_tokens"),
    (dict(max_new_tokens=64, long_fraction=1.5), "long_fraction"),
    (dict(max_new_tokens=64, long_fraction=-0.1), "long_fraction"),
])
def test_bad_skew_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        skewed.Skew(**kwargs)


def test_request_key_reads_the_pool_ids() -> None:
    sim = fake(skewed.Skew(max_new_tokens=8))
    pool = stepper.Pool(sim, group_size=3)
    prompts = skewed.prompts_of(2, prompts_per_step=2, seed=0)
    pool.add(prompts, step=2, version=0, seed=None)
    assert [skewed.request_key(r) for r in sim.running] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert [p.index for p in prompts] == [4, 5]
    with pytest.raises(ValueError):
        skewed.request_key("req-1-2")


# ---------------------------------------------------------------- idle accounting


@pytest.mark.parametrize("records, capacity, wall, idle, busy, batch", [
    ([(1.0, 4), (1.0, 4)], 4, 2.0, 0.0, 1.0, 4.0),               # full batch all the time
    ([(1.0, 4), (1.0, 1)], 4, 2.0, 0.375, 1.0, 2.5),             # a straggler alone for half the time
    ([(1.0, 8)], 4, 1.0, 0.0, 1.0, 8.0),                         # above capacity counts as full
    ([(1.0, 4)], 4, 4.0, 0.75, 0.25, 4.0),                       # not stepping at all is idle
    ([(0.5, 2), (1.5, 4)], 4, 2.0, 0.125, 1.0, 3.5),             # time-weighted, not step-weighted
])
def test_occupancy(records: list[tuple[float, int]], capacity: int, wall: float, idle: float, busy: float,
                   batch: float) -> None:
    out = skewed.occupancy(records, capacity=capacity, wall=wall)
    assert (out["idle_fraction"], out["busy_fraction"], out["mean_batch"]) == (idle, busy, batch)
    assert out["engine_steps"] == len(records)


@pytest.mark.parametrize("records, capacity, wall, field", [
    ([(1.0, 1)], 0, 1.0, "capacity"), ([(1.0, 1)], 1, 0.0, "wall"), ([(2.0, 1)], 1, 1.0, "wall")])
def test_occupancy_refuses_bad_input(records: list[tuple[float, int]], capacity: int, wall: float,
                                     field: str) -> None:
    with pytest.raises(ValueError, match=field):
        skewed.occupancy(records, capacity=capacity, wall=wall)


def test_metered_records_the_batch_each_step_ran() -> None:
    sim = fake(skewed.Skew(max_new_tokens=8))
    metered = skewed.Metered(sim, clock=sim.clock)
    pool = stepper.Pool(metered, group_size=2)
    pool.add(skewed.prompts_of(0, prompts_per_step=2, seed=0), step=0, version=0, seed=None)
    lengths = sorted(state[1] for state in sim.running.values())
    while pool.busy():
        pool.step()
    assert [n for _, n in metered.records] == [sum(1 for x in lengths if x >= k) for k in range(1, lengths[-1] + 1)]
    assert metered.wall() == pytest.approx(0.01 * lengths[-1]) and not metered.running


def test_interpolated_step_cost() -> None:
    cost = skewed.interpolate([(4, 0.4), (1, 0.1), (2, 0.3)])
    assert [cost(b) for b in (0, 1, 2, 3, 4, 9)] == pytest.approx([0.1, 0.1, 0.3, 0.35, 0.4, 0.4])
    with pytest.raises(ValueError, match="points"):
        skewed.interpolate([])


# ---------------------------------------------------------------- both loops, one workload


def _run(partial: bool, skew: skewed.Skew, *, steps: int = 6, prompts: int = 4, group: int = 4,
         lag: int = 1) -> dict[str, Any]:
    sim = fake(skew, sleep=0.003)
    return skewed.run_mode(partial_rollouts=partial, backend=sim, steps=steps, prompts_per_step=prompts,
                           group_size=group, max_policy_lag=lag, seed=0, clock=sim.clock, deadline=60)


def test_partial_rollouts_fill_the_slots_stragglers_leave() -> None:
    skew = skewed.Skew(max_new_tokens=64, long_fraction=0.1, seed=1)
    off = _run(False, skew)
    on = _run(True, skew)
    for out in (off, on):        # the same work, delivered whole, nothing skipped or refused
        assert out["completions"] == 6 * 4 * 4 and out["groups"] == 24 and out["syncs"] == 5
        assert out["skipped_work"] == 0 and out["unexpected"] == [] and out["sync_failures"] == 0
    assert on["tokens"] == off["tokens"]
    # whole batch: each step runs until its longest completion; serials of step s are s*P+1 .. (s+1)*P
    longest = [max(skew.length(key=k, sample=i) for k in range(s * 4 + 1, s * 4 + 5) for i in range(4))
               for s in range(6)]
    assert off["engine_steps"] == sum(longest) and off["switches"] == 0
    assert off["engine_wall_seconds"] == pytest.approx(0.01 * sum(longest))     # the flat step cost, nothing else
    # partial: the next step's work runs beside the stragglers, so fewer engine steps for the same tokens
    assert on["engine_steps"] < off["engine_steps"]
    assert on["idle_fraction"] < off["idle_fraction"]
    assert on["switches"] > 0 and on["switched_completions"] > 0   # weights changed under running requests


def test_without_lag_partial_rollouts_have_nothing_to_overlap() -> None:
    """maxPolicyLag 0: the next step's work goes out only after this one is complete, so neither loop can start it
    beside the stragglers: the same engine steps (the ceiling of the gain is 1 + maxPolicyLag)."""
    skew = skewed.Skew(max_new_tokens=64, long_fraction=0.1, seed=1)
    off = _run(False, skew, lag=0)
    on = _run(True, skew, lag=0)
    assert on["engine_steps"] == off["engine_steps"] and on["tokens"] == off["tokens"]
