"""Pod security, the job's NetworkPolicy and the checkpoint volume in the rendered children (goldens pin the
full objects; these name the rules)."""
from __future__ import annotations

from typing import Any

import pytest

import opbuilders
from kubeforge.api import contract
from kubeforge.operator import render
from kubeforge.operator.render import checkpoint, context, security

CTX = context.RenderContext(namespace="ns", uid="u")


def _sts(out: render.Rendered, role: str) -> dict[str, Any]:
    return next(o for o in out.desired if o["kind"] == "StatefulSet" and o["metadata"]["name"] == f"tiny-{role}")


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What the `restricted` Pod Security Standard (v1.34) refuses in ``pod`` (a pod spec)."""
    out = []
    psc = pod.get("securityContext", {})
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        out.append("host namespaces")
    out += [f"volume {v['name']} type" for v in pod.get("volumes", [])
            if not set(v) - {"name"} <= {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                         "persistentVolumeClaim", "projected", "secret"}]
    for c in pod["containers"] + pod.get("initContainers", []):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation != false")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or set(sc.get("capabilities", {}).get("add", [])) - {
                "NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: capabilities")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            out.append(f"{c['name']}: runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runAsUser 0")
        if (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault",
                                                                                            "Localhost"):
            out.append(f"{c['name']}: seccompProfile")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
    return out


@pytest.mark.parametrize("role", contract.ROLES)
def test_role_pods_pass_restricted_with_a_read_only_root(role: str) -> None:
    pod = _sts(render.render(opbuilders.job("tiny"), CTX), role)["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/tmp"] == security.TMP_VOLUME
    assert {"name": "HOME", "value": "/tmp"} in c["env"]


def test_the_checker_catches_a_bare_pod() -> None:
    bare = {"containers": [{"name": "x", "ports": [{"containerPort": 1, "hostPort": 1}]}],
            "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    assert len(restricted_violations(bare)) == 6


def test_only_the_trainer_gets_a_token() -> None:
    out = render.render(opbuilders.job("tiny"), CTX)
    got = {r: _sts(out, r)["spec"]["template"]["spec"]["automountServiceAccountToken"] for r in contract.ROLES}
    assert got == {"generator": False, "verifier": False, "trainer": True}


def test_a_role_may_set_its_own_home() -> None:
    job = opbuilders.job("tiny", spec__roles__generator={"env": [{"name": "HOME", "value": "/data"}]})
    env = _sts(render.render(job, CTX), "generator")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "HOME"] == ["/data"]


def test_network_policy_admits_own_pods_and_metrics_only() -> None:
    (pol,) = [o for o in render.render(opbuilders.job("tiny"), CTX).desired if o["kind"] == "NetworkPolicy"]
    spec = pol["spec"]
    own = {"matchLabels": {contract.LABEL_JOB: "tiny"}}
    assert spec["podSelector"] == own and spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [{"from": [{"podSelector": own}]},
                               {"ports": [{"protocol": "TCP", "port": contract.DEFAULT_PORT_BASE}]}]


def _trainer(job: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    sts = _sts(render.render(job, CTX), "trainer")
    return sts["spec"], sts["spec"]["template"]["spec"]


def test_checkpoint_on_a_named_claim() -> None:
    spec, pod = _trainer(opbuilders.job("tiny", spec__checkpoint={"path": "/ckpt", "claimName": "shared"}))
    assert {"name": checkpoint.VOLUME, "persistentVolumeClaim": {"claimName": "shared"}} in pod["volumes"]
    assert {"name": checkpoint.VOLUME, "mountPath": "/ckpt"} in pod["containers"][0]["volumeMounts"]
    assert "volumeClaimTemplates" not in spec


def test_checkpoint_claim_per_trainer() -> None:
    spec, pod = _trainer(opbuilders.job("tiny", spec__checkpoint={"volumeClaimTemplate": {"storage": "1Gi"}}))
    (tpl,) = spec["volumeClaimTemplates"]
    assert tpl["metadata"]["name"] == checkpoint.VOLUME
    assert tpl["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    assert not any(v["name"] == checkpoint.VOLUME for v in pod["volumes"])
    assert {"name": checkpoint.VOLUME, "mountPath": "/checkpoints"} in pod["containers"][0]["volumeMounts"]


def test_checkpoint_default_is_an_empty_dir_unless_the_user_mounts_the_path() -> None:
    _, pod = _trainer(opbuilders.job("tiny"))
    assert {"name": checkpoint.VOLUME, "emptyDir": {}} in pod["volumes"]
    mine = {"volumes": [{"name": "mine", "hostPath": {"path": "/srv"}}],
            "volumeMounts": [{"name": "mine", "mountPath": "/checkpoints/"}]}
    _, pod = _trainer(opbuilders.job("tiny", spec__roles__trainer=mine))
    assert not any(v["name"] == checkpoint.VOLUME for v in pod["volumes"])
    assert [m["name"] for m in pod["containers"][0]["volumeMounts"] if m["mountPath"].startswith("/checkpoints")] \
        == ["mine"]


@pytest.mark.parametrize("role", ["generator", "verifier"])
def test_only_trainers_get_the_checkpoint_volume(role: str) -> None:
    job = opbuilders.job("tiny", spec__checkpoint={"claimName": "shared"})
    pod = _sts(render.render(job, CTX), role)["spec"]["template"]["spec"]
    assert not any(v["name"] == checkpoint.VOLUME for v in pod["volumes"])


# ---------------------------------------------------------------- agent pods (spec.agent)

AGENT_JOB = dict(spec__environment={"type": "Agent", "reward": "Verifiers"},
                 spec__agent={"replicas": 2, "program": ["python", "agent.py"]})


def test_agent_pods_render_restricted_with_the_agent_key_only() -> None:
    out = render.render(opbuilders.job("tiny", **AGENT_JOB), CTX)
    sts = _sts(out, contract.AGENT)
    pod = sts["spec"]["template"]["spec"]
    assert restricted_violations(pod) == [] and pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["args"] == ["role", "agent"]
    env = {e["name"]: e for e in c["env"]}
    assert contract.ENV_JOB_KEY not in env
    assert env[contract.ENV_AGENT_KEY]["valueFrom"]["secretKeyRef"]["name"] == "tiny-agent-key"
    assert env[contract.env_peers("generator")]["value"] == "tiny-generator-0.tiny.ns.svc:29500"
    # no gang membership, no attempt: a dead agent pod costs episodes, never a restart of the job
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels == {contract.LABEL_JOB: "tiny", contract.LABEL_MANAGED_BY: contract.MANAGED_BY,
                      contract.LABEL_ROLE: contract.AGENT}
    gen = {e["name"]: e for e in _sts(out, "generator")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert gen[contract.ENV_POD_IP]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert gen[contract.ENV_AGENT_KEY]["valueFrom"]["secretKeyRef"]["name"] == "tiny-agent-key"
    assert contract.ENV_AGENT_KEY not in {e["name"] for e in _sts(render.render(opbuilders.job("tiny"), CTX),
                                                                  "generator")["spec"]["template"]["spec"][
                                                                      "containers"][0]["env"]}


def test_the_network_policy_admits_the_agent_pods_and_no_one_else_to_the_endpoint() -> None:
    out = render.render(opbuilders.job("tiny", **AGENT_JOB), CTX)
    policy = next(o for o in out.desired if o["kind"] == "NetworkPolicy")
    agent_labels = _sts(out, contract.AGENT)["spec"]["template"]["metadata"]["labels"]
    own, metrics_only = policy["spec"]["ingress"]
    selector = own["from"][0]["podSelector"]["matchLabels"]
    assert selector.items() <= agent_labels.items()          # the agent pods are the job's pods
    endpoint_port = contract.DEFAULT_PORT_BASE + contract.PORT_AGENTS
    assert [p["port"] for p in metrics_only["ports"]] == [contract.DEFAULT_PORT_BASE + contract.PORT_METRICS]
    assert endpoint_port not in [p["port"] for p in metrics_only["ports"]]


# ---------------------------------------------------------------- sandbox pods (spec.sandbox)

SANDBOX_JOB = dict(spec__task={"code": {}, "seed": 0}, spec__algorithm__maxNewTokens=64,
                   spec__verifiers=[{"name": "tests", "type": "CodeExecution"}], spec__sandbox={"replicas": 2})


def _kind(out: render.Rendered, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in out.desired if o["kind"] == kind and o["metadata"]["name"] == name)


def test_sandbox_pods_render_restricted_holding_nothing_of_the_job() -> None:
    out = render.render(opbuilders.job("tiny", **SANDBOX_JOB), CTX)
    sts = _kind(out, "StatefulSet", "tiny-sandbox")
    pod = sts["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert pod["automountServiceAccountToken"] is False and "serviceAccountName" not in pod
    assert pod["enableServiceLinks"] is False
    (c,) = pod["containers"]
    assert c["args"] == ["role", "sandbox"] and c["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in c["env"]}
    assert contract.ENV_JOB_KEY not in env and contract.ENV_CONFIG not in env
    assert env[contract.ENV_SANDBOX_KEY]["valueFrom"]["secretKeyRef"]["name"] == "tiny-sandbox-key"
    assert not any("secret" in v or "configMap" in v for v in pod["volumes"])      # no mount of the job's
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}               # never unbounded
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert contract.LABEL_JOB not in labels and labels[contract.LABEL_SANDBOX_OF] == "tiny"
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert sts["metadata"]["labels"][contract.LABEL_JOB] == "tiny"                # the object routes to the job
    svc = _kind(out, "Service", "tiny-sandbox")
    assert svc["spec"]["selector"].items() <= labels.items() and svc["spec"]["clusterIP"] == "None"


def test_only_verifiers_reach_the_sandbox_pods_and_they_reach_nothing() -> None:
    out = render.render(opbuilders.job("tiny", **SANDBOX_JOB), CTX)
    labels = _kind(out, "StatefulSet", "tiny-sandbox")["spec"]["template"]["metadata"]["labels"]
    job_policy = _kind(out, "NetworkPolicy", "tiny-network")
    # the job's policy selects pods by the job label: sandbox pods are neither protected nor admitted by it
    own = job_policy["spec"]["podSelector"]["matchLabels"]
    assert not own.items() <= labels.items()
    policy = _kind(out, "NetworkPolicy", "tiny-sandbox-network")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"] and policy["spec"]["egress"] == []
    verifiers, metrics_only = policy["spec"]["ingress"]
    verifier_labels = _sts(out, "verifier")["spec"]["template"]["metadata"]["labels"]
    (peer,) = verifiers["from"]
    assert peer["podSelector"]["matchLabels"].items() <= verifier_labels.items()
    for role in ("generator", "trainer"):
        assert not peer["podSelector"]["matchLabels"].items() <= _sts(out, role)["spec"]["template"]["metadata"][
            "labels"].items()
    assert [p["port"] for p in verifiers["ports"]] == [contract.DEFAULT_PORT_BASE + contract.PORT_SANDBOX]
    assert [p["port"] for p in metrics_only["ports"]] == [contract.DEFAULT_PORT_BASE + contract.PORT_METRICS]


def test_the_verifiers_are_told_the_pool_and_no_one_else_is() -> None:
    out = render.render(opbuilders.job("tiny", **SANDBOX_JOB), CTX)

    def env_of(role: str) -> dict[str, Any]:
        return {e["name"]: e for e in _sts(out, role)["spec"]["template"]["spec"]["containers"][0]["env"]}

    ver = env_of("verifier")
    assert ver[contract.ENV_SANDBOXES]["value"] == ("tiny-sandbox-0.tiny-sandbox.ns.svc:29500,"
                                                    "tiny-sandbox-1.tiny-sandbox.ns.svc:29500")
    assert ver[contract.ENV_SANDBOX_KEY]["valueFrom"]["secretKeyRef"]["name"] == "tiny-sandbox-key"
    for role in ("generator", "trainer"):
        assert contract.ENV_SANDBOX_KEY not in env_of(role)
    plain = render.render(opbuilders.job("tiny"), CTX)
    assert not any(o["metadata"]["name"].startswith("tiny-sandbox") for o in plain.desired)
