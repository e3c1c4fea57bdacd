"""Generators beyond ``minReplicas`` (surplus) are outside the gang by construction: their own StatefulSet without
the gang's membership, ordinals continuing the gang-held ones, and no pods until the gang is placed."""
from __future__ import annotations

from typing import Any

import opbuilders
from opbuilders import T0, pod
from kubeforge.api import contract, rljob
from kubeforge.operator import lifecycle, names, observed, reasons, render, status
from kubeforge.operator.render import context

CTX = context.RenderContext(namespace="ns", uid="u1")
UNSCHED = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu"


def _job(**gen: Any) -> rljob.RLJob:
    return opbuilders.job("tiny", spec__roles__generator={"replicas": 12, "minReplicas": 1, **gen})


def _sets(job: rljob.RLJob, ctx: context.RenderContext) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in render.render(job, ctx).desired if o["kind"] == "StatefulSet"}


def _gang(*, bound: bool) -> list[dict[str, Any]]:
    node = "kwok-gpu-0" if bound else None
    return [pod("tiny", r, 0, node=node, ready=bound, unschedulable=None if bound else UNSCHED)
            for r in contract.ROLES]


def _surplus(*indexes: int, bound: bool = False) -> list[dict[str, Any]]:
    return [pod("tiny", "generator", i, gang_held=1, node="kwok-gpu-0" if bound else None, ready=bound,
                unschedulable=None if bound else UNSCHED) for i in indexes]


def _decide(job: rljob.RLJob, pods: list[dict[str, Any]]) -> tuple[lifecycle.Plan, rljob.RLJobStatus]:
    obs = observed.observe(pods, ())
    plan = lifecycle.decide(job, obs, now=T0)
    return plan, status.compute(job, obs, plan, generation=1, now=T0)


def test_only_the_minimum_is_gang_held_and_ordinals_stay_contiguous() -> None:
    sets = _sets(_job(), CTX)
    held, surplus = sets["tiny-generator"], sets["tiny-gen-surplus"]
    assert held["spec"]["replicas"] == 1 and surplus["spec"]["replicas"] == 11
    assert surplus["spec"]["ordinals"] == {"start": 1}
    assert "scheduling.x-k8s.io/pod-group" in held["spec"]["template"]["metadata"]["labels"]
    labels = surplus["spec"]["template"]["metadata"]["labels"]
    assert "scheduling.x-k8s.io/pod-group" not in labels and labels[names.LABEL_SURPLUS] == "true"
    assert surplus["spec"]["selector"]["matchLabels"][names.LABEL_SURPLUS] == "true"
    group = next(o for o in render.render(_job(), CTX).desired if o["kind"] == "PodGroup")
    assert group["spec"]["minMember"] == 3                    # 1 generator, 1 verifier, 1 trainer
    env = {e["name"]: e.get("value") for e in surplus["spec"]["template"]["spec"]["containers"][0]["env"]}
    peers = env[contract.env_peers("generator")].split(",")
    assert peers[0].startswith("tiny-generator-0.") and peers[1].startswith("tiny-gen-surplus-1.")
    assert [p.split(".")[0].rsplit("-", 1)[1] for p in peers] == [str(i) for i in range(12)]
    # the trainer's address of a joining generator is the same name (runtime/trainer/start.generator_address)
    assert contract.peer_host("tiny", "generator", 5, "ns", gang_held=1) == peers[5].rsplit(":", 1)[0]


def test_no_surplus_statefulset_without_min_replicas() -> None:
    job = opbuilders.job("tiny", spec__roles__generator={"replicas": 3})
    assert set(_sets(job, CTX)) == {"tiny-generator", "tiny-verifier", "tiny-trainer"}
    assert _sets(job, CTX)["tiny-generator"]["spec"]["replicas"] == 3
    # minReplicas removed while surplus pods exist: the surplus StatefulSet goes
    gone = render.render(job, context.RenderContext(namespace="ns", uid="u1", surplus_present=True)).absent
    assert [o["metadata"]["name"] for o in gone] == ["tiny-gen-surplus"]


def test_surplus_waits_until_the_gang_is_placed() -> None:
    job = _job()
    plan, _ = _decide(job, _gang(bound=False))
    assert not plan.surplus_active
    ctx = context.RenderContext(namespace="ns", uid="u1", surplus_active=plan.surplus_active)
    assert _sets(job, ctx)["tiny-gen-surplus"]["spec"]["replicas"] == 0
    plan, _ = _decide(job, _gang(bound=True))
    assert plan.surplus_active
    # once the surplus has pods, a gang member restarting alone does not scale them away
    restarting = [pod("tiny", "generator", 0, node=None, ready=False), pod("tiny", "verifier", 0),
                  pod("tiny", "trainer", 0)]
    plan, _ = _decide(job, restarting + _surplus(1, 2, bound=True))
    assert plan.surplus_active and plan.surplus_present


def test_waiting_surplus_is_not_a_gang_matter() -> None:
    """The gang is placed and ready; surplus generators are Pending for room: Running, GangScheduled True."""
    _, s = _decide(_job(), _gang(bound=True) + _surplus(*range(1, 12)))
    gang = next(c for c in s.conditions if c.type == reasons.GANG_SCHEDULED)
    assert (gang.status, gang.reason) == ("True", reasons.SCHEDULED)
    assert s.phase == "Running" and s.roles["generator"].replicas == 12 and s.roles["generator"].ready == 1
