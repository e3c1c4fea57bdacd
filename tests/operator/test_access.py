"""``access.NEEDS`` against the code: everything the operator asks of the API server must be in it.

What the code uses is derived here, not listed: every ``apply.Cluster`` method the operator package calls is run
against a local HTTP server that records the requests (method, path, content type), with the kinds the renderers
produce for the generic ones; kopf's watches come from the handler registry; the per-job Role's rules (which RBAC
lets the operator grant only if it holds them) from the renderer. The chart side (its rules per mode equal to
``NEEDS``) is ``e2e/test_helm.py::test_chart_rbac_is_exactly_the_operators_needs``; the API server's word is
``e2e/test_rbac.py``.
"""
from __future__ import annotations

import ast
import contextlib
import http.server
import inspect
import json
import pathlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import opbuilders
from kubeforge.api import contract, load
from kubeforge.operator import access, apply, handlers, kubeconfig, queueing, render
from kubeforge.operator.render import context, rbac, secret, workload
from kubeforge.operator.render import pool as pool_render

OPERATOR = pathlib.Path(apply.__file__).parent
CTX = context.RenderContext(namespace="ns", uid="00000000-0000-0000-0000-000000000001", image="kubeforge/runtime:t")
Request = tuple[str, str, str]       # method, path, content type


@contextlib.contextmanager
def recording() -> Iterator[tuple[apply.Cluster, list[Request]]]:
    """A Cluster talking to a local server that answers every request with an empty object and records it."""
    seen: list[Request] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append((self.command, self.path, self.headers.get("Content-Type") or "application/json"))
            body = json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any  # noqa: N815 - http.server's names

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        creds = kubeconfig.Credentials(server=f"http://127.0.0.1:{server.server_address[1]}", verify=False)
        yield apply.Cluster(creds, pool_size=2), seen
    finally:
        server.shutdown()
        server.server_close()


def jobs() -> list[Any]:
    """RLJobs covering every renderer branch that makes another kind: each gang backend, surplus generators."""
    return [opbuilders.job("tiny"), opbuilders.job("tiny", spec__gang__backend="Volcano", spec__gang__queue="rl"),
            opbuilders.job("tiny", spec__gang__backend="KAI"),
            opbuilders.job("tiny", spec__gang__backend="Kueue", spec__gang__queue="team-a"),
            opbuilders.job("tiny", spec__gang__backend="None"),
            opbuilders.job("tiny", spec__roles__generator={"replicas": 4, "minReplicas": 1})]


def rendered_children() -> list[dict[str, Any]]:
    """Every object the reconcile applies or deletes: the renderers' output (desired and absent) and the
    Workloads of a job labelled for Kueue."""
    out: list[dict[str, Any]] = []
    for job in jobs():
        r = render.render(job, CTX)
        out += [*r.desired, *r.absent]
    queued = opbuilders.job("tiny", spec__roles__generator={"replicas": 2, "minReplicas": 1})
    out += [workload.workload(queued, CTX), workload.grow_workload(queued, CTX, 1)]
    shared = load.parse_pool({"kind": contract.POOL_KIND, "metadata": {"name": "shared"},
                              "spec": {"model": {"builtin": "tiny"}}})
    out += pool_render.render(shared, pool_render.PoolContext(namespace="ns", uid="u"))     # a GeneratorPool's
    return out


def lease() -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "kf", "namespace": "kubeforge-system"}}


def pool_body() -> dict[str, Any]:
    return {"apiVersion": contract.API_VERSION, "kind": contract.POOL_KIND,
            "metadata": {"name": "shared", "namespace": "ns", "uid": "u"}}


def rljob_body() -> dict[str, Any]:
    return {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
            "metadata": {"name": "tiny", "namespace": "ns", "uid": "u"}}


#: How the operator calls each Cluster method (the generic ones: with every kind it hands them).
RECIPES: dict[str, Callable[[apply.Cluster], None]] = {
    "get_lease": lambda c: c.get_lease("kubeforge-system", "kf"),
    "create_lease": lambda c: c.create_lease(lease()),
    "replace_lease": lambda c: c.replace_lease(lease()),
    "get_rljob": lambda c: c.get_rljob("ns", "tiny"),
    "list_pods": lambda c: c.list_pods("ns", "tiny"),
    "list_pods_at": lambda c: c.list_pods_at("ns", "tiny", not_older_than=5),
    "get": lambda c: [c.get(queueing.API_VERSION, "Workload", "ns", "tiny"),
                      c.get(contract.API_VERSION, contract.POOL_KIND, "ns", "shared"),
                      c.get("apps/v1", "StatefulSet", "ns", "shared-pool")],
    "list_rljobs": lambda c: c.list_rljobs("ns"),
    "patch_object": lambda c: c.patch_object(pool_body(), {"metadata": {"finalizers": []}}),
    "list_of_job": lambda c: c.list_of_job(queueing.API_VERSION, "Workload", "ns", "tiny"),
    "get_kueue": lambda c: [c.get_kueue(p, "x") for p in ("resourceflavors", "workloadpriorityclasses")],
    "patch_object_status": lambda c: [c.patch_object_status(workload.workload(opbuilders.job("tiny"), CTX), {}),
                                      c.patch_object_status(pool_body(), {})],
    "apply": lambda c: [c.apply(o) for o in rendered_children()],
    "delete": lambda c: [c.delete(o) for o in [*rendered_children(), lease()]],
    "get_node": lambda c: c.get_node("n1"),
    "get_node_lease": lambda c: c.get_node_lease("n1"),
    "force_delete_pod": lambda c: c.force_delete_pod("ns", "tiny-trainer-0", "u"),
    "patch_status": lambda c: c.patch_status("ns", "tiny", {}),
    "patch_pod": lambda c: c.patch_pod("ns", "tiny-trainer-0", {}),
    "create_if_absent": lambda c: [c.create_if_absent(secret.job_key_secret(opbuilders.job("tiny"), CTX,
                                                                             key_hex="00")),
                                   c.create_if_absent(pool_render.key_secret(     # a GeneratorPool's key
                                       load.parse_pool({"kind": contract.POOL_KIND, "metadata": {"name": "shared"},
                                                        "spec": {"model": {"builtin": "tiny"}}}),
                                       pool_render.PoolContext(namespace="ns", uid="u"), key_hex="00"))],
    "delete_rljob": lambda c: c.delete_rljob("ns", "tiny"),
    "post_event": lambda c: c.post_event(rljob_body(), type="Normal", reason="R", message="m", now="t"),
    "served_resources": lambda c: c.served_resources("scheduling.x-k8s.io/v1alpha1"),
    "delete_webhook_configuration": lambda c: c.delete_webhook_configuration("kubeforge.dev"),
}


def called_cluster_methods() -> set[str]:
    """Names of the ``apply.Cluster`` methods called anywhere in the operator package (outside apply.py): an
    attribute call on a receiver named ``cluster`` / ``self.cluster``."""
    out = set()
    for path in OPERATOR.rglob("*.py"):
        if path.name == "apply.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                recv = node.func.value
                name = recv.id if isinstance(recv, ast.Name) else recv.attr if isinstance(recv, ast.Attribute) else ""
                if name == "cluster":
                    out.add(node.func.attr)
    return out


def cluster_verbs() -> set[str]:
    return {n for n, f in inspect.getmembers(apply.Cluster, inspect.isfunction) if not n.startswith("_")} - {"request"}


def test_every_cluster_method_the_operator_calls_has_a_recipe() -> None:
    called = called_cluster_methods()
    assert called, "the scan found no call: it no longer matches how the operator calls its client"
    assert called <= cluster_verbs(), called - cluster_verbs()
    assert set(RECIPES) == cluster_verbs(), ("a Cluster method without a recipe here (add it, and what it needs "
                                             f"to access.NEEDS): {cluster_verbs() ^ set(RECIPES)}")


@pytest.mark.parametrize("method", sorted(RECIPES))
def test_what_each_client_call_needs_is_declared(method: str) -> None:
    with recording() as (cluster, seen):
        RECIPES[method](cluster)
    assert seen, f"{method} sent no request"
    used = {k for m, p, ct in seen for k in access.of_request(m, p, ct)}
    declared = access.NEEDS if method != "delete_webhook_configuration" else access.SELF_REGISTERED
    missing = sorted(k for k in used if not access.covers(k, declared))
    assert not missing, f"{method} uses what access.NEEDS does not list: {missing}"


def test_apply_needs_create_and_patch_for_every_rendered_kind() -> None:
    """Server-side apply creates an absent object: both verbs, for every kind the renderers make."""
    with recording() as (cluster, seen):
        RECIPES["apply"](cluster)
    kinds = {(o["apiVersion"], o["kind"]) for o in rendered_children()}
    assert ("kueue.x-k8s.io/v1beta2", "Workload") in kinds and ("apps/v1", "StatefulSet") in kinds
    assert len({p.split("?")[0].rsplit("/", 1)[0] for _, p, _ in seen}) >= len(kinds) - 2   # podgroups share plural
    for _, path, ct in seen:
        assert {v for v, *_ in access.of_request("PATCH", path, ct)} == {"create", "patch"}


def test_kopf_watches_are_declared_in_both_modes() -> None:
    reg = handlers.build_registry(None, None, pool_router=object())  # type: ignore[arg-type]  # not called here
    watched = {(h.selector.group or "", h.selector.any_name) for h in reg._watching.get_all_handlers()}
    assert ("kubeforge.dev", contract.PLURAL) in watched and ("", "pods") in watched
    assert ("kubeforge.dev", contract.POOL_PLURAL) in watched
    for group, plural in watched:
        for verb in ("list", "watch"):
            # namespaced in namespaced mode; the same rules, cluster-wide, in cluster-wide mode
            assert access.covers((verb, group, plural, True)), (verb, group, plural)


def test_the_per_job_role_grants_only_what_the_operator_holds() -> None:
    for job in jobs():
        for rule in rbac.role(job, CTX)["rules"]:
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert access.covers((verb, group, res, True)), (verb, group, res)


def test_cluster_scoped_resources_are_cluster_scope() -> None:
    """A namespaced Role cannot grant a cluster-scoped resource: each such need must be in Scope.CLUSTER (the
    chart puts those into a ClusterRole in both modes)."""
    cluster_scoped = {("", "nodes"), ("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions"),
                      ("kueue.x-k8s.io", "resourceflavors"), ("kueue.x-k8s.io", "workloadpriorityclasses"),
                      ("admissionregistration.k8s.io", "validatingwebhookconfigurations")}
    for n in (*access.NEEDS, *access.SELF_REGISTERED):
        assert ((n.group, n.resource) in cluster_scoped) == (n.scope is access.Scope.CLUSTER), n
    # and the client reaches them without a namespace
    with recording() as (cluster, seen):
        RECIPES["get_kueue"](cluster)
        RECIPES["get_node"](cluster)
    assert all(not ns for m, p, ct in seen for (_, _, _, ns) in access.of_request(m, p, ct))


@pytest.mark.parametrize(("method", "path", "ct", "want"), [
    ("GET", "/api/v1/namespaces/ns/pods?labelSelector=x", "", {("list", "", "pods", True)}),
    ("GET", "/api/v1/nodes/n1", "", {("get", "", "nodes", False)}),
    ("PATCH", "/apis/apps/v1/namespaces/ns/statefulsets/s", "application/apply-patch+yaml",
     {("create", "apps", "statefulsets", True), ("patch", "apps", "statefulsets", True)}),
    ("PATCH", "/apis/kubeforge.dev/v1alpha1/namespaces/ns/rljobs/t/status", "application/merge-patch+json",
     {("patch", "kubeforge.dev", "rljobs/status", True)}),
    ("PUT", "/apis/coordination.k8s.io/v1/namespaces/s/leases/l", "", {("update", "coordination.k8s.io", "leases", True)}),
    ("GET", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/f", "", {("get", "kueue.x-k8s.io", "resourceflavors", False)}),
    ("GET", "/apis/scheduling.x-k8s.io/v1alpha1", "", set()),
])
def test_of_request(method: str, path: str, ct: str, want: set[tuple[str, str, str, bool]]) -> None:
    assert access.of_request(method, path, ct or "application/json") == want
