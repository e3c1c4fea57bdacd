"""Focused checks of render invariants (the golden files pin the full objects)."""
from __future__ import annotations

from typing import Any

import pytest

import opbuilders
from kubeforge.api import contract
from kubeforge.operator import names, render
from kubeforge.operator.render import context, env, gang, placement

CTX = context.RenderContext(namespace="ns", uid="u")


def _by_kind(out: render.Rendered, kind: str) -> list[dict]:
    return [o for o in out.desired if o["kind"] == kind]


def test_every_child_is_owned_and_labelled() -> None:
    out = render.render(opbuilders.job("tiny"), CTX)
    assert len(out.desired) == 1 + 3 + 1 + 1 + 1 + 3  # config, rbac, network policy, service, podgroup, statefulsets
    for obj in out.desired:
        assert obj["metadata"]["labels"][contract.LABEL_JOB] == "tiny"
        ref = obj["metadata"]["ownerReferences"][0]
        assert ref["uid"] == "u" and ref["controller"] is True and ref["kind"] == "RLJob"


def test_one_headless_service_names_every_role_pod() -> None:
    out = render.render(opbuilders.job("tiny"), CTX)
    (svc,) = _by_kind(out, "Service")
    assert svc["metadata"]["name"] == contract.service_name("tiny") == "tiny"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    for sts in _by_kind(out, "StatefulSet"):   # a pod's DNS name is <hostname>.<serviceName>: the one Service
        assert sts["spec"]["serviceName"] == "tiny"
        labels = sts["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())


def test_env_contract_peers_and_world_sizes() -> None:
    job = opbuilders.job("tiny", spec__roles__generator={"replicas": 3})
    envs = {e["name"]: e for e in env.role_env(job, CTX, role="trainer")}
    assert envs[contract.env_replicas("generator")]["value"] == "3"
    peers = envs[contract.env_peers("generator")]["value"].split(",")
    assert peers == [f"tiny-generator-{i}.tiny.ns.svc:{contract.DEFAULT_PORT_BASE}" for i in range(3)]
    assert envs[contract.ENV_INDEX]["valueFrom"]["fieldRef"]["fieldPath"] == \
        f"metadata.labels['{names.LABEL_POD_INDEX}']"
    assert envs[contract.ENV_BIND_HOST]["value"] == "0.0.0.0"
    assert envs[contract.ENV_REPORT]["value"] == "pod-annotation"


def test_role_env_cannot_override_contract() -> None:
    """Admission refuses KUBEFORGE_* names in a role's env (kubeforge.api.validate); should one get past it (a job
    stored before the webhook existed), the renderer still keeps the contract's value."""
    good = opbuilders.job("tiny", spec__roles__trainer={"env": [{"name": "MINE", "value": "1"}]})
    doc = good.model_dump(mode="json", by_alias=True, exclude_none=True)
    doc["spec"]["roles"]["trainer"]["env"].insert(0, {"name": contract.ENV_ROLE, "value": "x"})
    job = type(good).model_validate(doc)
    envs = env.role_env(job, CTX, role="trainer")
    assert [e["value"] for e in envs if e["name"] == contract.ENV_ROLE] == ["trainer"]
    assert {"name": "MINE", "value": "1"} in envs


def test_inactive_context_scales_to_zero_and_drops_gang() -> None:
    job = opbuilders.job("tiny")
    out = render.render(job, context.RenderContext(namespace="ns", uid="u", active=False, gang_active=False))
    assert all(s["spec"]["replicas"] == 0 for s in _by_kind(out, "StatefulSet"))
    assert [o["kind"] for o in out.absent] == ["PodGroup"]
    draining = render.render(job, context.RenderContext(namespace="ns", uid="u", attempt=1, active=False))
    assert _by_kind(draining, "PodGroup") and not draining.absent
    sts = _by_kind(draining, "StatefulSet")[0]
    assert sts["spec"]["template"]["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
    assert sts["spec"]["selector"]["matchLabels"] == {contract.LABEL_JOB: "tiny", contract.LABEL_ROLE: "generator"}


def test_coscheduling_gang_spans_all_roles() -> None:
    job = opbuilders.job("tiny", spec__roles__generator={"replicas": 4}, spec__roles__verifier={"replicas": 2},
                         spec__gang__scheduleTimeoutSeconds=30)
    parts = gang.render(job, CTX)
    (group,) = parts.objects
    assert group["spec"] == {"minMember": 7, "scheduleTimeoutSeconds": 30}
    assert parts.pod_labels == {"scheduling.x-k8s.io/pod-group": "tiny"}
    job3 = opbuilders.job("tiny", spec__roles__generator={"replicas": 4, "minReplicas": 3})
    assert gang.render(job3, CTX).objects[0]["spec"]["minMember"] == 5          # generators beyond 3 not held


def test_gang_registry_covers_every_backend() -> None:
    from kubeforge.api import rljob
    # Auto has no renderer of its own: the operator resolves it into ctx.gang_backend (gangauto)
    assert set(gang.REGISTRY) == {b.value for b in rljob.GangBackend} - {rljob.GangBackend.AUTO.value}


def test_placement_required_packs_and_exclusive_repels_other_jobs() -> None:
    job = opbuilders.job("tiny", spec__placement={"topologyKey": "zone", "mode": "Required", "exclusive": True})
    aff = placement.affinity(job)
    assert aff is not None
    (term,) = aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {"labelSelector": {"matchLabels": {contract.LABEL_JOB: "tiny"}}, "topologyKey": "zone"}
    (anti,) = aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    ops = {(e["operator"], tuple(e.get("values", ()))) for e in anti["labelSelector"]["matchExpressions"]}
    assert ops == {("Exists", ()), ("NotIn", ("tiny",))}


def test_no_placement_means_no_affinity() -> None:
    assert placement.affinity(opbuilders.job("tiny")) is None


def test_role_affinity_keeps_trainer_apart_from_generators_and_beside_verifiers() -> None:
    job = opbuilders.job("tiny", spec__roles__trainer__affinity={"apartFrom": ["generator"],
                                                                   "colocateWith": ["verifier"]})
    aff = placement.pod_placement(job, "trainer")["affinity"]
    (anti,) = aff["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti == {"labelSelector": {"matchLabels": {contract.LABEL_JOB: "tiny", contract.LABEL_ROLE: "generator"}},
                    "topologyKey": "kubernetes.io/hostname"}
    (near,) = aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert near["labelSelector"]["matchLabels"][contract.LABEL_ROLE] == "verifier"
    assert "affinity" not in placement.pod_placement(job, "generator")   # only the role that asks gets terms
    # In the rendered StatefulSet too.
    out = render.render(job, CTX)
    sts = {o["metadata"]["name"]: o for o in _by_kind(out, "StatefulSet")}
    assert sts["tiny-trainer"]["spec"]["template"]["spec"]["affinity"] == aff


def test_role_affinity_preferred_merges_with_job_placement() -> None:
    job = opbuilders.job("tiny", spec__placement={"topologyKey": "zone"},
                         spec__roles__generator__affinity={"apartFrom": ["generator"], "mode": "Preferred",
                                                           "topologyKey": "rack"})
    aff = placement.pod_placement(job, "generator")["affinity"]
    assert len(aff["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]) == 1   # the job's packing
    (pref,) = aff["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert pref["weight"] == placement.PREFERRED_WEIGHT
    assert pref["podAffinityTerm"]["topologyKey"] == "rack"
    assert placement.affinity(job) == {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {contract.LABEL_JOB: "tiny"}}, "topologyKey": "zone"}]}}  # not mutated


@pytest.mark.parametrize("affinity", [{"colocateWith": ["trainer"]},
                                      {"colocateWith": ["verifier"], "apartFrom": ["verifier"]}])
def test_role_affinity_refuses_self_colocation_and_contradictions(affinity: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="colocateWith"):
        opbuilders.job("tiny", spec__roles__trainer__affinity=affinity)


def test_rbac_names_only_the_jobs_pods() -> None:
    out = render.render(opbuilders.job("tiny", spec__roles__generator={"replicas": 2}), CTX)
    (role,) = _by_kind(out, "Role")
    (rule,) = role["rules"]
    assert rule["verbs"] == ["get", "patch"] and rule["resources"] == ["pods"]
    assert sorted(rule["resourceNames"]) == ["tiny-generator-0", "tiny-generator-1", "tiny-trainer-0",
                                             "tiny-verifier-0"]


def test_startup_probe_holds_liveness_off_for_a_start_sized_from_the_progress_deadline() -> None:
    """A vLLM engine load makes no heartbeat: every role's container has a startupProbe on /startz whose allowance
    is start_deadline_seconds() (3 progress deadlines), so the liveness probe cannot kill a role still starting."""
    for deadline in (600, 45):
        job = opbuilders.job("tiny", spec__failurePolicy={"progressDeadlineSeconds": deadline})
        for sts in _by_kind(render.render(job, CTX), "StatefulSet"):
            c = sts["spec"]["template"]["spec"]["containers"][0]
            probe = c["startupProbe"]
            assert probe["httpGet"] == {"path": "/startz", "port": "metrics"}
            allowance = probe["periodSeconds"] * probe["failureThreshold"]
            assert 3 * deadline <= allowance < 3 * deadline + probe["periodSeconds"]
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_image_pull_secrets_reach_the_role_pods_that_name_them() -> None:
    """A private registry (docs/guide.md): the role's image and the Secrets to pull it with, per role."""
    job = opbuilders.job("tiny", spec__roles__trainer__image="registry.example/team/runtime:1",
                         spec__roles__trainer__imagePullSecrets=[{"name": "regcred"}])
    out = render.render(job, CTX)
    pods = {s["metadata"]["name"]: s["spec"]["template"]["spec"] for s in _by_kind(out, "StatefulSet")}
    assert pods["tiny-trainer"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pods["tiny-trainer"]["containers"][0]["image"] == "registry.example/team/runtime:1"
    assert "imagePullSecrets" not in pods["tiny-generator"] and "imagePullSecrets" not in pods["tiny-verifier"]


def test_an_image_pull_secret_name_must_be_a_secret_name() -> None:
    import pytest

    from kubeforge.api import load
    doc = load.dump(opbuilders.job("tiny"))
    doc["spec"]["roles"]["trainer"]["imagePullSecrets"] = [{"name": "Reg_Cred"}]
    with pytest.raises(load.InvalidRLJob, match=r"spec\.roles\.trainer\.imagePullSecrets\[0\]\.name"):
        load.parse(doc)


def test_trainer_pods_get_a_grace_period_above_the_stop_checkpoint_bound() -> None:
    """The stop checkpoint's chain of bounds (docs/failures.md): write within 45 s of SIGTERM < ranks SIGKILLed by
    their supervisor at 50 s < the trainer pod's terminationGracePeriodSeconds (60); other roles keep the default."""
    assert (contract.STOP_CHECKPOINT_WITHIN_SECONDS < contract.TRAINER_RANKS_GRACE_SECONDS
            < contract.TRAINER_TERMINATION_GRACE_SECONDS)
    grace = {s["metadata"]["name"]: s["spec"]["template"]["spec"].get("terminationGracePeriodSeconds")
             for s in _by_kind(render.render(opbuilders.job("tiny"), CTX), "StatefulSet")}
    assert grace == {"tiny-generator": None, "tiny-verifier": None,
                     "tiny-trainer": contract.TRAINER_TERMINATION_GRACE_SECONDS}
