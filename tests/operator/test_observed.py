"""Observed facts from raw pods: failures of both kinds, progress, scheduling."""
from __future__ import annotations

import opbuilders
from kubeforge.api import progress
from kubeforge.operator import observed


def test_restarted_container_is_a_failure() -> None:
    f = observed.pod_failure(opbuilders.pod("tiny", "verifier", 0, restarts=1, last_exit=3))
    assert f is not None and (f.role, f.pod, f.exit_code, f.reason, f.attempt) == \
        ("verifier", "tiny-verifier-0", 3, "Error", 0)


def test_failed_pod_is_a_failure() -> None:
    f = observed.pod_failure(opbuilders.pod("tiny", "trainer", 0, phase="Failed", exit_now=137, ready=False))
    assert f is not None and f.exit_code == 137


def test_clean_exit_and_running_are_not_failures() -> None:
    assert observed.pod_failure(opbuilders.pod("tiny", "trainer", 0, restarts=1, last_exit=0)) is None
    assert observed.pod_failure(opbuilders.pod("tiny", "trainer", 0)) is None


def test_malformed_progress_is_ignored() -> None:
    assert progress.ProgressReport.decode("{not json") is None
    assert progress.ProgressReport.decode('["a"]') is None
    assert progress.ProgressReport.decode('{"step": "x"}') is None
    p = progress.ProgressReport.decode('{"step": 3, "meanReward": 0.5, "policyVersion": 3, "done": false}')
    assert p == progress.ProgressReport(step=3, mean_reward=0.5, policy_version=3, done=False)


def test_unschedulable_message_and_stale_pods() -> None:
    obs = observed.observe([opbuilders.pod("tiny", "generator", 0, unschedulable="0/4 nodes are available"),
                            opbuilders.pod("tiny", "trainer", 0, attempt=1)])
    gen = obs.pods[0]
    assert gen.unschedulable == "0/4 nodes are available" and not gen.scheduled
    assert [p.name for p in obs.stale(1)] == ["tiny-generator-0"]
