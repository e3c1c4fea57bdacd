"""End to end in real pods: the operator runs the tiny RLJob to Succeeded with the real runtime on the real node.

The operator is installed as users install it: ``helm install`` of the chart, in a pod, in **cluster-wide mode**
(``installed``; the Kueue real-pod suite runs namespaced mode). One run (``run_real.run``) covers the whole issue, because one vLLM start in a pod costs a minute or two on 2
cores: every role on the real kubelet node (CPU only; the kwok GPU nodes keep their taint), vLLM generating in
the generator pod, rollouts over ZeroMQ between pods by headless-Service DNS names, weights over gloo, progress
from the trainer's pod annotation into the RLJob's status; then the trainer process killed with SIGUSR1 (exit
code 138) at step >= 8: the status names the role and exit code and counts the restart, the whole job restarts,
and the trainer resumes from its checkpoint on a hostPath volume with no lost or repeated step.

Cluster: the session's (``KF_CLUSTER_NAME`` / ``KUBECONFIG`` / ``make cluster-up REAL_NODE=1``) when its real node
is Ready; with ``KUBEFORGE_REAL_NODE=1`` a cluster with the real node is started when none runs (and stopped at
the end), and an unusable real node is a failure. Otherwise the module skips, saying why.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import pytest

import installed
import run_real
from kfcluster import testing
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

KILL_AFTER = 8


@pytest.fixture(scope="module")
def result(real_node_cluster: run_real.Acquired, tmp_path_factory: pytest.TempPathFactory) -> run_real.Result:
    workdir = tmp_path_factory.mktemp("e2e-real")
    res = run_real.run(cluster=real_node_cluster.cluster, workdir=workdir, kill_after_step=KILL_AFTER,
                       mode=installed.CLUSTER_WIDE)
    setup = real_node_cluster.setup_seconds
    figures = {**res.figures(), "cluster_setup_s": None if setup is None else round(setup, 1)}
    print("E2E-REAL " + json.dumps(figures))
    out = os.environ.get("KF_E2E_REAL_OUT")     # `make e2e-real` prints these files after the suite
    if out:
        pathlib.Path(out).with_suffix(".figures.json").write_text(json.dumps(figures) + "\n")
        pathlib.Path(out).write_text(json.dumps(res.status) + "\n")
    return res


def _role_pods(res: run_real.Result, role: str) -> list[dict[str, Any]]:
    return [p for p in res.pods if p["metadata"]["labels"].get(run_real.LABEL_ROLE) == role]


def test_job_succeeds_with_progress_in_status(result: run_real.Result) -> None:
    st = result.status
    assert st.get("phase") == "Succeeded", json.dumps(st)[:2000]
    assert st["progress"]["step"] == result.steps
    # a JSON number: 1.0 comes back as 1 (tiny's only verifier is ExactAnswer with weight 1, so rewards lie in [0, 1])
    assert 0.0 <= testing.api_number(st["progress"]["meanReward"], field="progress.meanReward") <= 1.0
    complete = next(c for c in st["conditions"] if c["type"] == "Complete")
    assert complete["status"] == "True"
    assert result.apply_to_running_s is not None and result.apply_to_succeeded_s is not None


def test_the_chart_installed_operator_used_only_what_its_rbac_grants(result: run_real.Result) -> None:
    """The operator ran in a pod under the chart's cluster-wide RBAC; every API call it counted is declared."""
    assert result.operator["mode"] == installed.CLUSTER_WIDE
    assert result.api_requests and not result.undeclared, (result.undeclared, result.api_requests)


def test_every_role_ran_in_real_pods_on_the_real_node(result: run_real.Result) -> None:
    for role in ("generator", "verifier", "trainer"):
        pods = _role_pods(result, role)
        assert pods, f"no {role} pod seen"
        for p in pods:
            assert p["spec"]["nodeName"] == realnode.NODE_NAME
            assert p["spec"]["nodeSelector"] == {realnode.NODE_LABEL: "true"}
            assert "nvidia.com/gpu" not in json.dumps(p["spec"]["containers"][0].get("resources", {}))
            assert p["status"].get("podIP", "").startswith("10.88."), p["status"].get("podIP")
    # each pod has its own network namespace: different IPs, so rollouts and weights crossed pods
    ips = {p["status"]["podIP"] for p in result.pods if p["status"].get("podIP")}
    assert len(ips) >= 3


def test_peers_are_headless_service_dns_names(result: run_real.Result) -> None:
    env = {e["name"]: e.get("value") for e in _role_pods(result, "generator")[0]["spec"]["containers"][0]["env"]}
    ns = result.pods[0]["metadata"]["namespace"]
    assert env["KUBEFORGE_PEERS_TRAINER"] == f"tiny-trainer-0.tiny.{ns}.svc:29500"
    assert env["KUBEFORGE_PEERS_VERIFIER"] == f"tiny-verifier-0.tiny.{ns}.svc:29500"


def test_vllm_generated_in_the_generator_pod(result: run_real.Result) -> None:
    assert result.generator_logs, "generator log not captured"
    assert any("vLLM engine up in" in text for text in result.generator_logs), result.generator_logs[-1][-3000:]


def test_weights_crossed_pods_and_reward_rose(result: run_real.Result) -> None:
    records = [d for t in result.trainer_logs for d in run_real.json_lines(t) if "mean_reward" in d and "step" in d]
    synced = [d for d in records if (d.get("weight_sync_bytes") or 0) > 0]
    assert len(synced) >= result.steps // 2, "weight syncs missing from the trainer's records"
    by_step = {d["step"]: d["mean_reward"] for d in records}          # the last record of a step wins
    first = sum(by_step[s] for s in range(1, 11)) / 10
    last = sum(by_step[s] for s in range(result.steps - 9, result.steps + 1)) / 10
    assert last > first + 0.3, (first, last)


def test_killed_trainer_shows_in_status(result: run_real.Result) -> None:
    killed, st = result.killed, result.failure_status
    assert killed is not None and st is not None, "the trainer was not killed or its failure never showed"
    failure = st["lastFailure"]
    assert failure["role"] == "trainer" and failure["pod"] == "tiny-trainer-0"
    assert failure["exitCode"] == killed["exit_code"] == 138
    assert st["restarts"] == 1 and result.status["restarts"] == 1
    assert result.status["lastFailure"]["exitCode"] == 138
    assert result.status["attempt"] == 1
    assert any(p == "Restarting" for _, p in result.phases), result.phases


def test_trainer_resumed_from_its_checkpoint_without_lost_or_repeated_steps(result: run_real.Result) -> None:
    assert len(result.trainer_logs) == 2, f"expected the killed and the resumed trainer, got {len(result.trainer_logs)}"
    before, after = (run_real.step_sequence(t) for t in result.trainer_logs)
    resumed0, steps0 = before
    resumed1, steps1 = after
    every = 5                                            # examples/tiny.yaml: checkpoint.everySteps
    assert resumed0 == 0 and steps0 == list(range(1, len(steps0) + 1)), steps0
    assert steps0[-1] >= KILL_AFTER
    assert resumed1 is not None and resumed1 > 0 and resumed1 % every == 0, resumed1
    assert steps0[-1] - every <= resumed1 <= steps0[-1]   # the newest checkpoint before the kill
    assert steps1 == list(range(resumed1 + 1, result.steps + 1)), steps1
    lineage = steps0[:resumed1] + steps1                 # steps the final model was trained through
    assert lineage == list(range(1, result.steps + 1))
    # the checkpoints outlived the pods on the hostPath volume, the last one at the final step
    assert f"step-{result.steps:09d}" in result.checkpoints, result.checkpoints


# ------------------------------------------------------------------ the tiny multi-turn job (opt-in: one more run)

MULTITURN = os.environ.get("KF_E2E_MULTITURN", "") in ("1", "true", "yes")
MULTITURN_MANIFEST = run_real.ROOT / "examples" / "tiny-multiturn.yaml"


@pytest.fixture(scope="module")
def multiturn(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> run_real.Result:
    """``examples/tiny-multiturn.yaml`` in real pods, no fault: its environments step in the two verifier pods.
    Opt-in (another 10-20 minutes on 2 busy cores); ``make e2e-real MANIFEST=examples/tiny-multiturn.yaml`` is the
    same run without pytest."""
    if not MULTITURN:
        pytest.skip("opt-in: KF_E2E_MULTITURN=1")
    cluster = request.getfixturevalue("cluster")
    res = run_real.run(cluster=cluster, workdir=tmp_path_factory.mktemp("e2e-real-multiturn"), kill_after_step=None,
                       base=MULTITURN_MANIFEST)
    print("E2E-REAL-MULTITURN " + json.dumps(res.figures()))
    return res


def test_multiturn_environments_ran_in_the_verifier_pods(multiturn: run_real.Result) -> None:
    assert multiturn.succeeded, json.dumps(multiturn.status)[:2000]
    served = multiturn.env_servers()
    verifiers = sorted(p["metadata"]["name"] for p in _role_pods(multiturn, "verifier"))
    assert sorted(served) == verifiers and len(verifiers) == 2, served          # both verifier pods served
    for line in served.values():
        resets, steps = (int(w) for w in line.split()[2:5:2])               # "environment server: R resets, S steps"
        assert resets > 0 and steps > 0, line
    records = [d for t in multiturn.trainer_logs for d in run_real.json_lines(t) if "mean_reward" in d and "step" in d]
    by_step = {d["step"]: d["mean_reward"] for d in records}
    first = sum(by_step[s] for s in range(1, 11)) / 10
    last = sum(by_step[s] for s in range(multiturn.steps - 9, multiturn.steps + 1)) / 10
    assert last > first + 0.3, (first, last)         # tests/runtime/test_multiturn_learning.py's margin
