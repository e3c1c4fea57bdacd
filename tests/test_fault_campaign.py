"""The fault campaign's cluster mode, its pure parts (bench/fault_campaign_cluster.py): the fault plan, and the
summary that says how many faults were delivered and what the trainer's lineage lost or repeated. The campaign
itself needs two real nodes (docs/benchmarks.md, "Fault campaign on two real nodes")."""
from __future__ import annotations

import json
import pathlib
import random
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT / "bench") not in sys.path:     # the campaign is a bench script; its e2e imports come from `pythonpath`
    sys.path.insert(0, str(ROOT / "bench"))

import fault_campaign_cluster as fc  # noqa: E402


def test_plan_has_the_node_faults_asked_and_pod_kills_for_the_rest() -> None:
    kinds = fc.plan(faults=10, node_losses=2, partitions=2, rng=random.Random(0))
    assert len(kinds) == 10
    assert (kinds.count("node_loss"), kinds.count("partition"), kinds.count("pod_kill")) == (2, 2, 6)


def test_plan_refuses_more_node_faults_than_faults() -> None:
    with pytest.raises(ValueError):
        fc.plan(faults=2, node_losses=2, partitions=1, rng=random.Random(0))


def _log(steps: list[int], *, resumed: int | None = None) -> str:
    lines = [json.dumps({"resumed": resumed})] if resumed is not None else []
    lines += [json.dumps({"step": s, "mean_reward": 0.5, "policy_version": s}) for s in steps]
    return "\n".join(lines) + "\n"


def _summary(logs: list[str], *, faults: list[fc.Fault], kinds: list[str], reason: str | None = None,
             steps: int = 12) -> dict[str, object]:
    return fc.summarize(faults=faults, kinds=kinds, reason=reason, status={"phase": "Succeeded", "restarts": 1},
                        trainer_logs=logs, steps=steps, policy={}, started=0.0, run_dir=pathlib.Path("/x"))


def test_summary_follows_the_lineage_through_a_resume() -> None:
    """Steps 1-8, then a restart resumed from the checkpoint at 5: 6-8 were retrained, none lost or repeated."""
    faults = [fc.Fault(kind="node_loss", step=8, at=0.0, detail={"pods": ["tiny-trainer-0"]}, recovery_s=90.0)]
    got = _summary([_log(list(range(1, 9))), _log(list(range(6, 13)), resumed=5)], faults=faults,
                   kinds=["node_loss"])
    assert (got["faultsRequested"], got["faultsDelivered"], got["faultsNotDeliveredReason"]) == (1, 1, None)
    assert (got["steps"], got["lost_steps"], got["repeated_steps"], got["retrained_steps"]) == (12, 0, 0, 3)
    assert got["policy_version_monotonic"] is True
    assert got["faults_by_kind"] == {"pod_kill": 0, "node_loss": 1, "partition": 0}


def test_summary_counts_lost_steps_and_faults_not_delivered() -> None:
    faults = [fc.Fault(kind="pod_kill", step=3, at=0.0, detail={"role": "generator"}, recovery_s=4.0)]
    got = _summary([_log([1, 2, 3, 5])], faults=faults, kinds=["pod_kill", "partition"],
                   reason="the job ended (Succeeded, step 12) after 1 of 2 faults")
    assert (got["faultsRequested"], got["faultsDelivered"]) == (2, 1)
    assert got["faultsNotDeliveredReason"] == "the job ended (Succeeded, step 12) after 1 of 2 faults"
    assert got["lost_steps"] == 12 - 4
    assert got["kills_by_role"] == {"generator": 1, "verifier": 0, "trainer": 0}


def test_a_repeated_step_in_one_log_is_counted() -> None:
    got = _summary([_log([1, 2, 2, 3])], faults=[], kinds=[], steps=3)
    assert (got["lost_steps"], got["repeated_steps"]) == (0, 1)


def _fault(kind: str, *, pods: list[str] | None = None, left: bool = False) -> fc.Fault:
    return fc.Fault(kind=kind, step=5, at=0.0, detail={"pods": pods} if pods is not None else {}, left_running=left)


@pytest.mark.parametrize(("fault", "step", "phase", "on_node", "want"), [
    # a step from rollouts made before a kill is no recovery: the phase must leave Running and come back
    (_fault("pod_kill"), 6, "Running", [], False),
    (_fault("pod_kill", left=True), 6, "Starting", [], False),
    (_fault("pod_kill", left=True), 6, "Running", [], True),
    (_fault("pod_kill", left=True), 5, "Running", [], False),
    # a node loss that hit the job: also none of its pods left on the node
    (_fault("node_loss", pods=["tiny-generator-0"], left=True), 6, "Running", ["tiny-generator-0"], False),
    (_fault("node_loss", pods=["tiny-generator-0"], left=True), 6, "Running", [], True),
    (_fault("node_loss", pods=[]), 6, "Running", [], True),
    (_fault("partition", pods=["tiny-generator-0"]), 6, "Running", ["tiny-generator-0"], True),
    (_fault("partition", pods=["tiny-generator-0"]), 5, "Running", ["tiny-generator-0"], False),
])
def test_recovered(fault: fc.Fault, step: int, phase: str, on_node: list[str], want: bool) -> None:
    assert fc.recovered(fault, step=step, phase=phase, on_node=on_node) is want


def test_plan_has_the_long_partitions_and_environment_server_kills_asked() -> None:
    kinds = fc.plan(faults=6, node_losses=1, partitions=1, long_partitions=1, env_kills=2, rng=random.Random(0))
    assert sorted(kinds) == sorted(["node_loss", "partition", "long_partition", "env_kill", "env_kill", "pod_kill"])
    with pytest.raises(ValueError):
        fc.plan(faults=2, node_losses=0, partitions=0, long_partitions=2, env_kills=1, rng=random.Random(0))


def test_summary_sums_fenced_writes_and_infra_masked_rollouts_over_the_run() -> None:
    """``infraMaskedRollouts`` sums every step record of every trainer container (a retrained step's masking
    happened too); ``fencedWrites`` is the RLJob's cumulative status."""
    first = "\n".join(json.dumps({"step": s, "mean_reward": 0.5, "policy_version": s, "infra_masked_rollouts": m})
                      for s, m in [(1, 0), (2, 3), (3, 1)]) + "\n"
    second = _log([3, 4], resumed=2).replace('"policy_version": 4}', '"policy_version": 4, "infra_masked_rollouts": 2}')
    faults = [fc.Fault(kind="env_kill", step=2, at=0.0, detail={"role": "verifier"}, recovery_s=5.0),
              fc.Fault(kind="long_partition", step=3, at=0.0, detail={"pods": ["tiny-trainer-0"]}, recovery_s=80.0)]
    got = fc.summarize(faults=faults, kinds=["env_kill", "long_partition"], reason=None, trainer_logs=[first, second],
                       status={"phase": "Succeeded", "fencedWrites": {"checkpoints": 1, "pushes": 2, "reports": 0}},
                       steps=4, policy={}, started=0.0, run_dir=pathlib.Path("/x"))
    assert got["infraMaskedRollouts"] == 6
    assert got["fencedWrites"] == {"checkpoints": 1, "pushes": 2, "reports": 0} and got["fencedWritesTotal"] == 3
    assert got["faults_by_kind"] == {"pod_kill": 0, "node_loss": 0, "partition": 0, "long_partition": 1,
                                     "env_kill": 1}
    assert (got["lost_steps"], got["repeated_steps"]) == (0, 0)


@pytest.mark.parametrize(("fault", "step", "phase", "want"), [
    (_fault("env_kill"), 6, "Running", False),                     # the phase must leave Running and come back
    (_fault("env_kill", left=True), 6, "Running", True),
    (_fault("long_partition", pods=["tiny-generator-0"]), 6, "Running", False),
    (_fault("long_partition", pods=["tiny-generator-0"], left=True), 6, "Running", True),
    (_fault("long_partition", pods=[]), 6, "Running", True),
])
def test_recovered_new_kinds(fault: fc.Fault, step: int, phase: str, want: bool) -> None:
    assert fc.recovered(fault, step=step, phase=phase, on_node=[]) is want
