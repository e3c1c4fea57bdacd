"""The chart's RBAC, asked of the API server: for every (verb, group, resource) the operator's code uses
(``kubeforge.operator.access.NEEDS``, held to the code by tests/operator/test_access.py), the API server's
authorizer answers for the chart's ServiceAccount, in namespaced and in cluster-wide mode, after a real ``helm
install`` of the chart. It fails when the chart lacks a rule.

One SubjectAccessReview per (verb, resource, namespace) as the account (what ``kubectl auth can-i --as`` sends,
batched into one kubectl call), plus ``kubectl auth can-i --as`` itself for a few, to show both agree. Kueue's CRDs are
installed (``kueue_cluster``), so its cluster-scoped resources are real ones. The install waits for nothing (no operator image is needed to hold RBAC: the Deployment's pod stays Pending on the kwok nodes),
with the webhook off (a webhook whose pod never runs would refuse the session's other RLJobs) and two replicas (the
leader election's Lease Role). Namespaced mode watches one namespace that exists before the install (left as it
was: no Pod Security label added, not the release's) and one that does not (created by the chart, `restricted`,
kept after uninstall).
"""
from __future__ import annotations

import json
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import installed
from kfcluster import lifecycle
from kubeforge.operator import access

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
EXTRA = ("webhook.enabled=false", "replicas=2")
Check = tuple[str, str, str, str | None]        # verb, group, resource, namespace (None: cluster-scoped / all)


def sar(account: str, check: Check) -> dict[str, Any]:
    verb, group, resource, ns = check
    plural, _, sub = resource.partition("/")
    sa_ns = account.split(":")[2]
    attrs = {"verb": verb, "group": group, "resource": plural, **({"subresource": sub} if sub else {}),
             **({"namespace": ns} if ns else {})}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": account, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}",
                                    "system:authenticated"], "resourceAttributes": attrs}}


def allowed(cluster: lifecycle.Cluster, account: str, checks: list[Check]) -> dict[Check, bool]:
    """The API server's answer to each check, for ``account`` (one kubectl call)."""
    doc = {"apiVersion": "v1", "kind": "List", "items": [sar(account, c) for c in checks]}
    run = cluster.kubectl.run("create", "-o", "json", "-f", "-", stdin=json.dumps(doc), timeout_s=120)
    items: list[dict[str, Any]] = []
    text, decoder = run.stdout.strip(), json.JSONDecoder()
    while text:     # kubectl prints one object after another
        obj, end = decoder.raw_decode(text)
        items += obj["items"] if obj.get("kind") == "List" else [obj]
        text = text[end:].strip()
    assert len(items) == len(checks), run.stdout[-500:]
    return {c: bool(i["status"].get("allowed")) for c, i in zip(checks, items, strict=True)}


def checks_of(rel: installed.Release, *, jobs_namespaces: list[str] | None) -> list[Check]:
    """Every verb of every need, where the chart must grant it: cluster-scoped ones without a namespace; the jobs'
    ones in each watched namespace (namespaced mode) or across all namespaces (cluster-wide: kopf's watches are
    cluster-wide, namespace ""); the Lease in the release namespace."""
    out: list[Check] = []
    for verb, group, resource, scope in sorted(access.flat(), key=str):
        if scope is access.Scope.CLUSTER:
            out.append((verb, group, resource, None))
        elif scope is access.Scope.RELEASE:
            out.append((verb, group, resource, rel.namespace))
        elif scope is access.Scope.NODE_LEASES:
            out.append((verb, group, resource, "kube-node-lease"))
        else:
            where: list[str | None] = list(jobs_namespaces) if jobs_namespaces else [None]
            out += [(verb, group, resource, ns) for ns in where]
    return out


def can_i(cluster: lifecycle.Cluster, account: str, verb: str, resource: str, *ns: str) -> bool:
    run = cluster.kubectl.run("auth", "can-i", verb, resource, *ns, f"--as={account}", check=False, timeout_s=60)
    return run.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("rbac")


@pytest.fixture(scope="module")
def namespaced(kueue_cluster: lifecycle.Cluster, workdir: pathlib.Path) -> Iterator[tuple[installed.Release, list[str]]]:
    suffix = uuid.uuid4().hex[:5]
    existing, absent, other = f"rbac-have-{suffix}", f"rbac-new-{suffix}", f"rbac-other-{suffix}"
    k = kueue_cluster.kubectl
    for ns in (existing, other):
        k.run("create", "namespace", ns)
    rel = installed.install(kueue_cluster, watch=(existing, absent), workdir=workdir / "ns", extra=EXTRA, wait=False,
                            on_real_node=False)
    try:
        yield rel, [existing, absent, other]
    finally:
        rel.uninstall()
        k.run("delete", "namespace", existing, absent, other, "--wait=false", check=False)


@pytest.fixture(scope="module")
def clusterwide(kueue_cluster: lifecycle.Cluster, workdir: pathlib.Path) -> Iterator[installed.Release]:
    rel = installed.install(kueue_cluster, watch=(), workdir=workdir / "cw", extra=EXTRA, wait=False,
                            on_real_node=False)
    try:
        yield rel
    finally:
        rel.uninstall()


def test_namespaced_mode_grants_every_need(kueue_cluster: lifecycle.Cluster,
                                           namespaced: tuple[installed.Release, list[str]]) -> None:
    rel, (existing, absent, other) = namespaced
    answers = allowed(kueue_cluster, rel.account, checks_of(rel, jobs_namespaces=[existing, absent]))
    denied = sorted(c for c, ok in answers.items() if not ok)
    assert not denied, f"the chart (namespaced mode) lacks: {denied}"
    # the Kueue reads of the done-when, the way a person checks them
    assert can_i(kueue_cluster, rel.account, "get", "resourceflavors.kueue.x-k8s.io")
    assert can_i(kueue_cluster, rel.account, "get", "workloadpriorityclasses.kueue.x-k8s.io")
    print("RBAC-NAMESPACED " + json.dumps({"checks": len(answers), "denied": len(denied)}))


def test_namespaced_mode_grants_nothing_in_other_namespaces(kueue_cluster: lifecycle.Cluster,
                                                            namespaced: tuple[installed.Release, list[str]]) -> None:
    """The check can fail: the jobs' rules asked in an unwatched namespace, and a read of Secrets, are refused."""
    rel, (existing, _, other) = namespaced
    jobs = [(v, g, r, other) for v, g, r, s in access.flat() if s is access.Scope.JOBS]
    answers = allowed(kueue_cluster, rel.account, [*jobs, ("get", "", "secrets", existing), ("list", "", "pods", None)])
    assert not [c for c, ok in answers.items() if ok], [c for c, ok in answers.items() if ok]


def test_watched_namespaces_absent_created_existing_left_alone(kueue_cluster: lifecycle.Cluster,
                                                               namespaced: tuple[installed.Release, list[str]]) -> None:
    rel, (existing, absent, _) = namespaced
    k = kueue_cluster.kubectl
    made = k.get_json("namespace", absent)["metadata"]
    assert made["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert made["annotations"]["meta.helm.sh/release-name"] == rel.name
    have = k.get_json("namespace", existing)["metadata"]
    assert "pod-security.kubernetes.io/enforce" not in (have.get("labels") or {})
    assert "meta.helm.sh/release-name" not in (have.get("annotations") or {})
    assert k.get_json("role", "-n", existing, f"{rel.name}-kubeforge")["rules"]


def test_cluster_wide_mode_grants_every_need(kueue_cluster: lifecycle.Cluster, clusterwide: installed.Release) -> None:
    rel = clusterwide
    answers = allowed(kueue_cluster, rel.account, checks_of(rel, jobs_namespaces=None))
    denied = sorted(c for c, ok in answers.items() if not ok)
    assert not denied, f"the chart (cluster-wide mode) lacks: {denied}"
    assert can_i(kueue_cluster, rel.account, "watch", "pods", "--all-namespaces")
    assert not can_i(kueue_cluster, rel.account, "get", "secrets", "-n", "kube-system")
    print("RBAC-CLUSTER-WIDE " + json.dumps({"checks": len(answers), "denied": len(denied)}))


def test_uninstall_keeps_a_created_namespace(kueue_cluster: lifecycle.Cluster, workdir: pathlib.Path) -> None:
    """`helm uninstall` must not delete the jobs' namespace the chart created (resource-policy keep)."""
    ns = f"rbac-keep-{uuid.uuid4().hex[:5]}"
    rel = installed.install(kueue_cluster, watch=(ns,), workdir=workdir / "keep", extra=EXTRA, wait=False,
                            on_real_node=False)
    rel.uninstall()
    try:
        got = kueue_cluster.kubectl.get_json("namespace", ns)
        assert got["status"]["phase"] == "Active" and not got["metadata"].get("deletionTimestamp")
    finally:
        kueue_cluster.kubectl.run("delete", "namespace", ns, "--wait=false", check=False)
