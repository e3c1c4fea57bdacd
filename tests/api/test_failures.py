"""The restart decision (kubeforge.api.failures.decide): one table, the operator and the launcher both use it."""
from __future__ import annotations

import pytest

from kubeforge.api import failures, rljob

F = failures.Failure


def policy(*rules: dict[str, object], max_restarts: int = 3) -> rljob.FailurePolicySpec:
    return rljob.FailurePolicySpec.model_validate({"maxRestarts": max_restarts, "rules": list(rules)})


GEN0 = F(role="generator", name="generator-0", exit_code=137, reason="Error")
GEN1 = F(role="generator", name="generator-1", exit_code=1, reason="Error")
VER0_EVICTED = F(role="verifier", name="verifier-0", exit_code=None, reason="Evicted")
TR0 = F(role="trainer", name="trainer-0", exit_code=137, reason="Error")
TR0_OOM = F(role="trainer", name="trainer-0", exit_code=137, reason="OOMKilled")
TR0_EXIT3 = F(role="trainer", name="trainer-0", exit_code=3, reason="Error")
ELASTIC = ({"action": "Fail", "onExitCodes": [3]}, {"action": "Ignore", "roles": ["verifier"], "onReasons": ["Evicted"]},
           {"action": "RestartRole", "roles": ["generator", "verifier"]})

CASES = [
    # id, policy, failures, restarts -> action, restart scope, counts, reason
    ("none", policy(), [], 0, None),
    ("default-restarts-all", policy(), [GEN0], 0, ("RestartAll", (), True, "")),
    ("default-used-up", policy(max_restarts=2), [GEN0], 2, ("Fail", (), False, "BackoffLimitExceeded")),
    ("zero-restarts", policy(max_restarts=0), [TR0], 0, ("Fail", (), False, "BackoffLimitExceeded")),
    ("role-generator", policy(*ELASTIC), [GEN0], 0, ("RestartRole", ("generator-0",), True, "")),
    ("role-two-generators-one-restart", policy(*ELASTIC), [GEN1, GEN0], 1,
     ("RestartRole", ("generator-0", "generator-1"), True, "")),
    ("role-used-up", policy(*ELASTIC, max_restarts=1), [GEN0], 1, ("Fail", (), False, "BackoffLimitExceeded")),
    ("fail-exit-code-first-match", policy(*ELASTIC), [TR0_EXIT3], 0, ("Fail", (), False, "FailedByRule")),
    ("fail-beats-restart", policy(*ELASTIC), [GEN0, TR0_EXIT3], 0, ("Fail", (), False, "FailedByRule")),
    ("ignore-evicted-verifier", policy(*ELASTIC), [VER0_EVICTED], 3, ("Ignore", ("verifier-0",), False, "")),
    ("trainer-no-rule-restarts-all", policy(*ELASTIC), [TR0], 0, ("RestartAll", (), True, "")),
    ("restart-role-on-trainer-means-all", policy({"action": "RestartRole"}), [TR0], 0, ("RestartAll", (), True, "")),
    ("all-beats-role", policy(*ELASTIC), [GEN0, TR0], 0, ("RestartAll", (), True, "")),
    ("reason-match", policy({"action": "Fail", "onReasons": ["OOMKilled"]}), [TR0_OOM], 0,
     ("Fail", (), False, "FailedByRule")),
    ("reason-no-match", policy({"action": "Fail", "onReasons": ["OOMKilled"]}), [TR0], 0, ("RestartAll", (), True, "")),
    ("role-and-code-both-needed", policy({"action": "Fail", "roles": ["generator"], "onExitCodes": [3]}), [TR0_EXIT3],
     0, ("RestartAll", (), True, "")),
    ("ignore-does-not-count-even-when-used-up", policy({"action": "Ignore"}, max_restarts=0), [GEN0], 0,
     ("Ignore", ("generator-0",), False, "")),
]


@pytest.mark.parametrize("pol,seen,restarts,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide_table(pol: rljob.FailurePolicySpec, seen: list[failures.Failure], restarts: int,
                      want: tuple[str, tuple[str, ...], bool, str] | None) -> None:
    d = failures.decide(pol, seen, restarts=restarts)
    if want is None:
        assert d is None
        return
    assert d is not None
    assert (d.action, d.restart, d.counts, d.reason) == want
    assert d.cause is not None and d.message.startswith(f"{d.cause.role} {d.cause.name} failed")


def test_decision_does_not_depend_on_order() -> None:
    pol = policy(*ELASTIC)
    assert failures.decide(pol, [GEN0, TR0_EXIT3, GEN1], restarts=0) == failures.decide(
        pol, [GEN1, GEN0, TR0_EXIT3], restarts=0)


def test_local_exit_codes_read_as_the_kubelet_reports_them() -> None:
    assert failures.from_exit(-9) == (137, "Error")
    assert failures.from_exit(3) == (3, "Error")


def test_rule_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="onExitCodes"):
        rljob.FailurePolicySpec.model_validate({"rules": [{"action": "Fail", "onExitCodes": [0]}]})
    with pytest.raises(ValueError):
        rljob.FailurePolicySpec.model_validate({"rules": [{"action": "Restart"}]})
    with pytest.raises(ValueError):
        rljob.FailurePolicySpec.model_validate({"rules": [{"action": "Fail", "onReasons": ["Sad"]}]})


TR0_PREEMPTED = F(role="trainer", name="trainer-0", exit_code=None, reason="Preempted")
GEN0_PREEMPTED = F(role="generator", name="generator-0", exit_code=None, reason="Preempted")
PREEMPTED_CASES = [
    # id, policy, failures, restarts -> action, restart scope, counts, reason, preempted
    ("preempted-restarts-all-even-with-no-restarts-left", policy(max_restarts=0), [TR0_PREEMPTED], 0,
     ("RestartAll", (), False, "", True)),
    ("preempted-generator-per-rule", policy(*ELASTIC, max_restarts=1), [GEN0_PREEMPTED], 1,
     ("RestartRole", ("generator-0",), False, "", True)),
    ("preempted-with-a-crash-is-a-failure", policy(max_restarts=1), [TR0_PREEMPTED, GEN0], 1,
     ("Fail", (), False, "BackoffLimitExceeded", False)),
    ("preempted-with-a-crash-counts", policy(max_restarts=3), [TR0_PREEMPTED, GEN0], 1,
     ("RestartAll", (), True, "", False)),
    ("a-rule-may-fail-a-preemption", policy({"action": "Fail", "onReasons": ["Preempted"]}), [TR0_PREEMPTED], 0,
     ("Fail", (), False, "FailedByRule", False)),
    ("a-rule-may-ignore-a-preemption", policy({"action": "Ignore", "onReasons": ["Preempted"]}), [GEN0_PREEMPTED], 0,
     ("Ignore", ("generator-0",), False, "", False)),
]


@pytest.mark.parametrize("pol,seen,restarts,want", [c[1:] for c in PREEMPTED_CASES],
                         ids=[c[0] for c in PREEMPTED_CASES])
def test_a_preempted_pod_is_a_preempted_job_not_a_failed_one(
        pol: rljob.FailurePolicySpec, seen: list[failures.Failure], restarts: int,
        want: tuple[str, tuple[str, ...], bool, str, bool]) -> None:
    """Item 4 of issue 28: a preemption restarts per the policy without using up maxRestarts; mixed with a real
    failure, the decision is the real failure's (counted)."""
    d = failures.decide(pol, seen, restarts=restarts)
    assert d is not None
    assert (d.action, d.restart, d.counts, d.reason, d.preempted) == want
    if d.preempted:
        assert d.message.endswith("(not counted against maxRestarts)") and " preempted: " in d.message
