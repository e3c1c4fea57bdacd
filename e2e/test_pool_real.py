"""A GeneratorPool in real pods (issue 40, "Done when"): one vLLM engine on the real node serves two tiny LoRA RLJobs
under the chart-installed operator; a foreign key is refused at the engine; the engine pod is deleted mid-run and
both jobs go on with no step lost or repeated; one job is deleted mid-run and the other goes on to Succeeded while
the pool's status and jobs file drop it. One run (``run_pool_real.run``: one engine start costs a minute or two on
2 cores, a second one for the engine loss); each test reads what that run recorded.

Cluster: as ``e2e/test_e2e_real.py`` (the ``real_node_cluster`` fixture; one real node per machine: run under
``flock /tmp/kubeforge-realnode.lock`` with ``KUBEFORGE_REAL_NODE=1`` by hand). What "trained" means here is what
``tests/runtime/test_pool_run.py`` asserts of the local pool, no more: each job's adapter pushes accepted (every
group sampled at the trainer's own policy version, on policy, the trainer's largest per-token ratio to the
behaviour logprobs at LoRA's exactness); no reward margin is claimed (docs/generator-pool.md says why).
"""
from __future__ import annotations

import json
import os
import pathlib
import pytest

import run_pool_real as prun
import run_real
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(2400)]

#: The longest pause allowed between two of job b's steps across job a's deletion (seconds). What a job that goes
#: may cost another: a batch of job a's the engine is sampling or sending when a's verifiers go (its send waits
#: ``serve.ROLLOUT_SEND_SECONDS``, 10 s, then drops it), plus ordinary steps of a loaded machine.
PAUSE_BOUND_S = 60.0
RATIO_BOUND = 1.02        # tests/runtime/test_pool_run.py's bound on the trainer's per-token ratio


@pytest.fixture(scope="module")
def result(real_node_cluster: run_real.Acquired, tmp_path_factory: pytest.TempPathFactory) -> prun.PoolResult:
    workdir = tmp_path_factory.mktemp("e2e-pool")
    res = prun.run(cluster=real_node_cluster.cluster, workdir=workdir)
    figures = {**res.figures(), "cluster_setup_s": real_node_cluster.setup_seconds, "workdir": str(workdir)}
    print("E2E-POOL " + json.dumps(figures))
    out = os.environ.get("KF_E2E_POOL_OUT")
    if out:
        pathlib.Path(out).write_text(json.dumps(figures) + "\n")
        for job, texts in res.trainer_logs.items():     # what each trainer waited on around the engine's loss
            pathlib.Path(f"{out}.trainer-{job}.log").write_text("".join(texts))
    return res


def _steps(res: prun.PoolResult, job: str) -> list[int]:
    return [d["step"] for d in res.records(job)]


def test_the_run_went_as_planned(result: prun.PoolResult) -> None:
    assert not result.errors, result.figures()
    b = result.statuses[prun.JOB_B]
    assert b.get("phase") == "Succeeded" and b["progress"]["step"] == prun.STEPS_B, json.dumps(b)[:2000]


def test_one_engine_in_a_real_pod_serves_both_jobs_which_have_no_generators(result: prun.PoolResult) -> None:
    assert len(result.engine_pods) == 2, "the engine pod and its replacement"
    for p in result.engine_pods:
        assert p["spec"]["nodeName"] == realnode.NODE_NAME
        assert p["status"]["podIP"].startswith("10.88."), p["status"]["podIP"]
    roles = {(p["metadata"]["labels"][prun.LABEL_JOB], p["metadata"]["labels"].get(run_real.LABEL_ROLE))
             for p in result.job_pods}
    assert roles == {(j, r) for j in (prun.JOB_A, prun.JOB_B) for r in ("trainer", "verifier")}, roles
    assert all(p["spec"]["nodeName"] == realnode.NODE_NAME for p in result.job_pods)
    assert any("vLLM engine up in" in text for text in result.engine_logs), "no engine start in the engine logs"


def test_every_step_once_each_job_on_its_own_adapter(result: prun.PoolResult) -> None:
    """Job b: steps 1..N once each; job a: 1..k once each until its deletion. Every group sampled at the trainer's
    own policy version (maxPolicyLag 0: the engine held the job's newest adapter, so its pushes were accepted),
    the trainer's per-token ratio to the behaviour logprobs at LoRA's exactness (no other job's adapter)."""
    assert _steps(result, prun.JOB_B) == list(range(1, prun.STEPS_B + 1))
    a = _steps(result, prun.JOB_A)
    assert a == list(range(1, len(a) + 1)) and len(a) > result.engine_loss["at_steps"][prun.JOB_A], a
    for job in (prun.JOB_A, prun.JOB_B):
        records = result.records(job)
        assert all(r["policy_lag"] and set(r["policy_lag"]) == {"0"} for r in records), \
            (job, [r["policy_lag"] for r in records])
        worst = max(r.get("logprob_mismatch_max_ratio") or 1.0 for r in records)
        assert worst < RATIO_BOUND, (job, [r.get("logprob_mismatch_max_ratio") for r in records])
        pushed = [r["step"] for r in records if (r.get("weight_sync_bytes") or 0) > 0]
        assert len(pushed) >= len(records) // 2, (job, pushed)


def test_a_foreign_key_is_refused_at_the_engine(result: prun.PoolResult) -> None:
    """Job b's key offered at job a's socket of the engine from this host, through the pod network."""
    f = result.foreign
    assert f and f["engine_ip"].startswith("10.88."), f
    assert f["unauthenticated_after"] > f["unauthenticated_before"], f


def test_a_deleted_engine_pod_is_replaced_and_both_jobs_go_on(result: prun.PoolResult) -> None:
    loss = result.engine_loss
    assert loss.get("new_uid") and loss["new_uid"] != loss["old_uid"], loss
    assert set(loss.get("first_step_after", {})) == {prun.JOB_A, prun.JOB_B}, loss
    for job in (prun.JOB_A, prun.JOB_B):
        log = "".join(result.trainer_logs[job])
        assert "generator-0 restarted" in log, f"{job}'s trainer never took the new engine for a restart"
    ledgers = result.ledgers()
    assert ledgers, "the deleted engine printed no ledger at its SIGTERM"
    first = ledgers[0]["jobs"]
    for job in (prun.JOB_A, prun.JOB_B):
        assert first[job]["syncs"] >= 1 and first[job]["completions"] > 0, first


def test_a_deleted_job_leaves_the_pool_and_the_other_goes_on(result: prun.PoolResult) -> None:
    gone = result.job_deleted
    assert gone, "job a was never deleted"
    times = [d["time"] for d in result.records(prun.JOB_B)]
    after = [t for t in times if t > gone["at"]]
    assert len(after) >= 2, (gone, times)
    before = max(t for t in times if t <= gone["at"])
    pauses = [b - a for a, b in zip([before, *after], after)]
    assert max(pauses) < PAUSE_BOUND_S, pauses
    assert prun.JOB_A not in result.pool_status.get("attachedJobs", [prun.JOB_A]), result.pool_status
    assert [p["name"] for p in result.pool_status.get("jobPorts", [])] == [prun.JOB_B], result.pool_status
    # read at the run's end: a finished job leaves the engines' jobs file too (docs/generator-pool.md), so job b is
    # listed only while it still runs; job a, deleted, never again
    assert prun.JOB_A not in result.jobs_file and set(result.jobs_file) <= {prun.JOB_B}, result.jobs_file

