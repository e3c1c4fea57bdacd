"""RolloutBuffer: staleness dropping (on add and while waiting), counting by reason, re-issue, bounds."""
from __future__ import annotations

import pytest

from kubeforge.runtime import types
from kubeforge.runtime.trainer import buffer


def group(*, index: int, step: int, version: int, rewards: list[float] | None = None) -> types.RolloutGroup:
    comps = [types.Completion(token_ids=[1, 2], logprobs=[-0.1, -0.2], text="ab") for _ in range(2)]
    return types.RolloutGroup(prompt=types.Prompt(index=index, text=f"p{index}", answer="a"),
                              prompt_token_ids=[5], completions=comps, policy_version=version, step=step,
                              rewards=[1.0, 0.0] if rewards is None else rewards)


def test_fresh_groups_are_kept_and_taken_in_prompt_order() -> None:
    b = buffer.RolloutBuffer(max_policy_lag=1, capacity=10)
    for i in (3, 1, 2):
        assert b.add(group=group(index=i, step=0, version=0), policy_version=0) is None
    assert not b.ready(step=0, expected=4, policy_version=0)
    assert b.ready(step=0, expected=3, policy_version=0)
    got = b.take(step=0, policy_version=0)
    assert [g.prompt.index for g in got] == [1, 2, 3]
    assert len(b) == 0 and b.next_step == 1
    assert b.lag_counts == {0: 3}
    assert sum(b.drops.values()) == 0


def test_stale_on_add_is_dropped_counted_and_reissued() -> None:
    b = buffer.RolloutBuffer(max_policy_lag=1, capacity=10)
    # policy at version 3: a group sampled at version 1 has lag 2 > 1 -> stale; lag 1 is fine
    assert b.add(group=group(index=0, step=3, version=1), policy_version=3) == buffer.STALE
    assert b.add(group=group(index=1, step=3, version=2), policy_version=3) is None
    assert b.drops[buffer.STALE] == 1
    reissue = b.drain_reissue()
    assert [(r.step, r.prompt.index) for r in reissue] == [(3, 0)]
    assert b.drain_reissue() == []


def test_groups_going_stale_while_waiting_are_evicted_by_ready() -> None:
    b = buffer.RolloutBuffer(max_policy_lag=1, capacity=10)
    b.add(group=group(index=0, step=2, version=0), policy_version=0)
    b.add(group=group(index=1, step=2, version=1), policy_version=1)
    # the policy moved to version 2: the version-0 group now lags 2 -> evicted; version 1 lags 1 -> kept
    assert not b.ready(step=2, expected=2, policy_version=2)
    assert b.drops == {buffer.STALE: 1}
    assert [(r.step, r.prompt.index) for r in b.drain_reissue()] == [(2, 0)]
    assert b.add(group=group(index=0, step=2, version=2), policy_version=2) is None  # the re-issued one
    assert b.ready(step=2, expected=2, policy_version=2)
    assert b.take(step=2, policy_version=2) and b.lag_counts == {0: 1, 1: 1}


def test_max_policy_lag_zero_means_strictly_on_policy() -> None:
    b = buffer.RolloutBuffer(max_policy_lag=0, capacity=10)
    assert b.add(group=group(index=0, step=1, version=0), policy_version=1) == buffer.STALE
    assert b.add(group=group(index=1, step=1, version=1), policy_version=1) is None


def test_late_duplicate_malformed_and_overflow_are_counted_by_reason() -> None:
    b = buffer.RolloutBuffer(max_policy_lag=2, capacity=2)
    b.add(group=group(index=0, step=0, version=0), policy_version=0)
    b.take(step=0, policy_version=0)
    assert b.add(group=group(index=9, step=0, version=0), policy_version=0) == buffer.LATE
    assert b.add(group=group(index=1, step=1, version=0), policy_version=0) is None
    assert b.add(group=group(index=1, step=1, version=0), policy_version=0) == buffer.DUPLICATE
    assert b.add(group=group(index=2, step=1, version=0, rewards=[1.0]), policy_version=0) == buffer.MALFORMED
    assert b.add(group=group(index=3, step=1, version=0), policy_version=0) is None
    assert b.add(group=group(index=4, step=1, version=0), policy_version=0) == buffer.OVERFLOW
    assert len(b) == 2
    assert b.drops == {buffer.LATE: 1, buffer.DUPLICATE: 1, buffer.MALFORMED: 1, buffer.OVERFLOW: 1}
    # re-issue: not the late one (its step is trained) nor the duplicate (a copy is held); malformed and
    # overflowed prompts of a step still to train are
    assert [(r.step, r.prompt.index) for r in b.drain_reissue()] == [(1, 2), (1, 4)]


def test_take_of_a_later_step_discards_older_steps_as_late() -> None:
    b = buffer.RolloutBuffer(max_policy_lag=5, capacity=10)
    b.add(group=group(index=0, step=0, version=0), policy_version=0)
    b.add(group=group(index=1, step=1, version=0), policy_version=0)
    assert [g.prompt.index for g in b.take(step=1, policy_version=0)] == [1]
    assert len(b) == 0 and b.drops == {buffer.LATE: 1}


def test_advance_after_resume_drops_trained_steps() -> None:
    b = buffer.RolloutBuffer(max_policy_lag=5, capacity=10)
    b.advance(next_step=10)
    assert b.add(group=group(index=0, step=9, version=9), policy_version=10) == buffer.LATE
    assert b.drain_reissue() == []


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        buffer.RolloutBuffer(max_policy_lag=-1, capacity=1)
    with pytest.raises(ValueError):
        buffer.RolloutBuffer(max_policy_lag=0, capacity=0)


def test_each_step_record_counts_its_own_drops_so_the_run_summary_sums_them_once() -> None:
    """A record carried the buffer's running total and the summary summed the records: 1 + 1 + 1 stale drops were
    reported as 1 + 2 + 3 = 6."""
    from kubeforge.api import progress
    from kubeforge.runtime.launcher import summary
    from kubeforge.runtime.trainer import record

    b = buffer.RolloutBuffer(max_policy_lag=0, capacity=10)
    recs = []
    for step in (1, 2, 3):
        assert b.add(group=group(index=0, step=step, version=step - 1), policy_version=step) == buffer.STALE
        metrics = progress.StepMetrics(step=step, loss=0.0, mean_reward=0.5, completions=2)
        recs.append(record.of(metrics, [], rollouts=b, sync=None, at=float(step), train_seconds=1.0,
                              wait_seconds=0.0, trained_version=step, max_policy_lag=0))
    assert [r.dropped_stale for r in recs] == [1, 1, 1]
    assert [r.dropped_total for r in recs] == [1, 1, 1]
    assert summary.summarize(recs, wall_seconds=3.0, metrics_path="m")["dropped_stale"] == 3
    assert b.drops[buffer.STALE] == 3                                   # the buffer's own count stays a total
