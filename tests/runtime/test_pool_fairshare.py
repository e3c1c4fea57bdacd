"""Deficit round robin of a pool engine (``generator.pool.fairshare``): shares follow the weights, an idle job takes
nothing and banks nothing, a job's items keep their order."""
from __future__ import annotations

import collections

import pytest

from kubeforge.runtime.generator.pool import fairshare


def drain(s: fairshare.Scheduler[str], limit: int = 10_000) -> list[tuple[str, str]]:
    out = []
    while (nxt := s.next()) is not None and len(out) < limit:
        out.append(nxt)
    return out


@pytest.mark.parametrize(("wa", "wb", "cost_a", "cost_b"), [
    (64, 64, 64, 64),        # equal jobs alternate
    (128, 64, 64, 64),       # twice the weight, twice the work
    (64, 64, 16, 64),        # small items: shares by cost, not by item count
    (48, 80, 48, 80),        # each job's item is one step's completions
])
def test_shares_follow_the_weights_while_both_have_work(wa: int, wb: int, cost_a: int, cost_b: int) -> None:
    s: fairshare.Scheduler[str] = fairshare.Scheduler()
    s.add_job("a", weight=wa)
    s.add_job("b", weight=wb)
    for i in range(400):
        s.push("a", f"a{i}", cost=cost_a)
        s.push("b", f"b{i}", cost=cost_b)
    served: collections.Counter[str] = collections.Counter()
    for _ in range(200):                 # a busy period: both still have work queued at its end
        job, _item = s.next()  # type: ignore[misc]
        served[job] += cost_a if job == "a" else cost_b
    assert s.queued("a") and s.queued("b")
    ratio = served["a"] / served["b"]
    assert ratio == pytest.approx(wa / wb, rel=0.1)
    assert abs(served["a"] - s.served("a")) < 1e-9


def test_a_job_with_nothing_queued_takes_nothing_and_banks_nothing() -> None:
    s: fairshare.Scheduler[str] = fairshare.Scheduler()
    s.add_job("a", weight=10)
    s.add_job("b", weight=10)
    for i in range(5):
        s.push("a", f"a{i}", cost=10)
    assert [j for j, _ in drain(s)] == ["a"] * 5       # b waits for its trainer: a gets the whole engine
    for i in range(4):                                  # b comes back: no burst for the time it was idle
        s.push("a", f"a{5 + i}", cost=10)
        s.push("b", f"b{i}", cost=10)
    order = [j for j, _ in drain(s)]
    assert order.count("a") == order.count("b") == 4
    assert all(order[k] != order[k + 1] for k in range(len(order) - 1))   # strict alternation
    assert s.next() is None


def test_items_of_a_job_keep_their_order_and_large_items_still_go() -> None:
    s: fairshare.Scheduler[str] = fairshare.Scheduler()
    s.add_job("a", weight=1)          # cost far above the weight: a few rounds of top-ups, then served
    s.add_job("b", weight=100)
    s.push("a", "a0", cost=50)
    s.push("a", "a1", cost=50)
    s.push("b", "b0", cost=100)
    got = drain(s)
    assert [i for j, i in got if j == "a"] == ["a0", "a1"]
    assert sorted(i for _, i in got) == ["a0", "a1", "b0"]


def test_remove_drops_the_queue_and_bad_input_is_refused() -> None:
    s: fairshare.Scheduler[str] = fairshare.Scheduler()
    s.add_job("a", weight=1)
    s.add_job("b", weight=1)
    s.push("a", "a0", cost=1)
    s.push("b", "b0", cost=1)
    assert s.remove("a") == ["a0"]
    assert drain(s) == [("b", "b0")]
    with pytest.raises(KeyError):
        s.push("a", "again", cost=1)
    with pytest.raises(ValueError, match="weight"):
        s.add_job("c", weight=0)
    with pytest.raises(ValueError, match="cost"):
        s.push("b", "free", cost=0)
