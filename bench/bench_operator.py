"""Operator bench: 50 RLJobs applied at once → p50/p99 time to all children created and to all pods Running,
plus the operator's peak RSS and CPU; baselines in the same run: the same number of pods as plain StatefulSets
applied directly, without and with a Coscheduling PodGroup per job (the second isolates the operator's own cost
from the gang scheduler's).

    python bench/bench_operator.py [--jobs 50] [--kubeconfig PATH]

Needs the test cluster (``make cluster-up``; uses ``$KUBECONFIG`` or starts/reuses it through ``kfcluster``).
Prints one JSON object last. Timings are client-side polls every 0.2 s, so each figure carries up to ~0.2 s of
polling granularity (the same for the baseline).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "operator"), str(ROOT / "e2e")]

import harness  # noqa: E402
import yaml  # noqa: E402

from kubeforge.api import contract  # noqa: E402
from kubeforge.operator import apply  # noqa: E402

POLL = 0.2
#: kwok nodes carry this taint; the bench's pods (operator's and baseline's alike) tolerate it.
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake", "effect": "NoSchedule"}
KINDS = [("apps/v1", "StatefulSet", 3), ("v1", "Service", 3), ("v1", "ConfigMap", 1), ("v1", "ServiceAccount", 1),
         ("networking.k8s.io/v1", "NetworkPolicy", 1),
         ("rbac.authorization.k8s.io/v1", "Role", 1), ("rbac.authorization.k8s.io/v1", "RoleBinding", 1),
         ("scheduling.x-k8s.io/v1alpha1", "PodGroup", 1)]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))], 3)


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "mean": round(statistics.fmean(xs), 3), "n": len(xs)}


def by_job(c: apply.Cluster, api: str, kind: str, ns: str, label: str) -> dict[str, list[dict[str, Any]]]:
    items = (c.request("GET", apply.path_of(api, kind, ns), query={"labelSelector": label}) or {}).get("items", [])
    out: dict[str, list[dict[str, Any]]] = {}
    for o in items:
        out.setdefault(o["metadata"]["labels"].get(label.split("=")[0], ""), []).append(o)
    return out


def running(pods: list[dict[str, Any]], want: int) -> bool:
    return len(pods) >= want and all(p.get("status", {}).get("phase") == "Running" for p in pods)


def wait_all(c: apply.Cluster, ns: str, applied: dict[str, float], *, label: str, children: bool,
             timeout_s: float) -> tuple[dict[str, float], dict[str, float]]:
    created: dict[str, float] = {}
    ran: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while (len(ran) < len(applied) or (children and len(created) < len(applied))) and time.monotonic() < deadline:
        now = time.monotonic()
        if children:
            counts = [by_job(c, api, kind, ns, label) for api, kind, _ in KINDS]
            for name in applied:
                if name not in created and all(len(cs.get(name, [])) >= n for cs, (_, _, n) in zip(counts, KINDS)):
                    created[name] = now - applied[name]
        pods = by_job(c, "v1", "Pod", ns, label)
        for name in applied:
            if name not in ran and running(pods.get(name, []), 3):
                ran[name] = now - applied[name]
        time.sleep(POLL)
    if len(ran) < len(applied):
        raise TimeoutError(f"only {len(ran)}/{len(applied)} reached Running in {timeout_s}s")
    return created, ran


def rljob(i: int, ns: str) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"] = {"name": f"b{i:03d}", "namespace": ns}
    for role in ("generator", "verifier", "trainer"):
        doc["spec"]["roles"].setdefault(role, {})["tolerations"] = [TOLERATION]
    return doc


def podgroup(i: int, ns: str) -> dict[str, Any]:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": f"s{i:03d}", "namespace": ns}, "spec": {"minMember": 3}}


def plain_statefulset(i: int, ns: str, *, gang: bool = False) -> dict[str, Any]:
    labels = {"bench": f"s{i:03d}"}
    pod_labels = {**labels, "scheduling.x-k8s.io/pod-group": f"s{i:03d}"} if gang else labels
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": f"s{i:03d}", "namespace": ns,
                                                                       "labels": labels},
            "spec": {"replicas": 3, "serviceName": f"s{i:03d}", "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": pod_labels},
                                  "spec": {"containers": [{"name": "c", "image": "kubeforge/runtime:test"}],
                                           "tolerations": [TOLERATION]}}}}


def post_all(c: apply.Cluster, docs: list[dict[str, Any]], path_of: Any, key: str) -> dict[str, float]:
    applied = {}
    for d in docs:
        if key == "label":
            applied.setdefault(d["metadata"]["name"], time.monotonic())
        else:
            applied[d["metadata"]["name"]] = time.monotonic()
        c.request("POST", path_of(d), body=d)
    return applied


def baseline(c: apply.Cluster, k: harness.K, ns: str, jobs: int, *, gang: bool, timeout_s: float) -> dict[str, Any]:
    """Plain StatefulSets (3 pods each) applied directly; with ``gang`` each also gets a PodGroup (minMember 3)."""
    t0 = time.monotonic()
    docs: list[dict[str, Any]] = []
    for i in range(jobs):
        docs += ([podgroup(i, ns)] if gang else []) + [plain_statefulset(i, ns, gang=gang)]
    applied = post_all(c, docs, lambda d: apply.path_of(d["apiVersion"], d["kind"], ns), "label")
    _, ran = wait_all(c, ns, applied, label="bench", children=False, timeout_s=timeout_s)
    out = {"pods_running_s": summary(list(ran.values())), "wall_s": round(time.monotonic() - t0, 2)}
    k.run("delete", "namespace", ns, "--wait=false")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--kubeconfig")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    kubeconfig = a.kubeconfig or harness.env_kubeconfig()
    kubectl = "kubectl"
    if not kubeconfig:
        from kfcluster import lifecycle
        cl = lifecycle.up()
        kubeconfig, kubectl = cl.kubeconfig, cl.kubectl.binary
    else:
        from kfcluster import binaries
        kubectl = str(binaries.bin_dir() / "kubectl")
    k = harness.K(kubectl=kubectl, kubeconfig=kubeconfig)
    k.ensure_crd()
    c = apply.Cluster(apply.load_credentials(kubeconfig))
    tag = uuid.uuid4().hex[:6]
    ns_base, ns_gang = k.namespace(f"bench-base-{tag}"), k.namespace(f"bench-gang-{tag}")
    ns_op = k.namespace(f"bench-op-{tag}")
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="bench-operator-"))
    op = harness.Operator(kubeconfig=kubeconfig, log_path=logdir / "operator.log", extra=("-n", ns_op))
    try:
        base = baseline(c, k, ns_base, a.jobs, gang=False, timeout_s=a.timeout)
        base_gang = baseline(c, k, ns_gang, a.jobs, gang=True, timeout_s=a.timeout)
        op.start()
        t0 = time.monotonic()
        docs = [rljob(i, ns_op) for i in range(a.jobs)]
        applied = post_all(c, docs, lambda d: apply.path_of(contract.API_VERSION, contract.KIND, ns_op), "name")
        created, ran = wait_all(c, ns_op, applied, label=contract.LABEL_JOB, children=True, timeout_s=a.timeout)
        op_wall = time.monotonic() - t0
        rss, cpu = op.peak_rss_kib(), op.cpu_seconds()
        gang_metric = [ln for ln in op.metrics().splitlines() if ln.startswith((
            "kubeforge_operator_gang_running_seconds_", "kubeforge_operator_reconciles_total",
            "kubeforge_operator_reconcile_duration_seconds_sum", "kubeforge_operator_reconcile_duration_seconds_count"))]
    finally:
        op.stop()
        k.run("delete", "namespace", ns_op, "--wait=false", check=False)
        k.run("delete", "namespace", ns_base, "--wait=false", check=False)
        k.run("delete", "namespace", ns_gang, "--wait=false", check=False)
    out = {
        "jobs": a.jobs, "pods_per_job": 3,
        "operator": {"children_created_s": summary(list(created.values())),
                     "pods_running_s": summary(list(ran.values())), "wall_s": round(op_wall, 2),
                     "peak_rss_mib": round(rss / 1024, 1), "cpu_s": round(cpu, 1), "metrics": gang_metric},
        "baseline_plain_statefulsets": base, "baseline_statefulsets_with_podgroup": base_gang,
        "load_average_1m": os.getloadavg()[0],
    }
    for name, b in (("plain", base), ("podgroup", base_gang)):
        for q in ("p50", "p99"):
            out[f"ratio_pods_running_{q}_vs_{name}"] = round(
                out["operator"]["pods_running_s"][q] / max(b["pods_running_s"][q], 1e-3), 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
