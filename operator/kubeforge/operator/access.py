"""What the operator asks of the API server: every (verb, API group, resource) it uses, and where.

Role: the one declared list the chart's RBAC must grant (``helm/kubeforge/templates/rbac.yaml``). Pure data and
pure functions, no I/O. Three checks hold it to the code and the chart:
- ``tests/operator/test_access.py`` derives what the code uses (every ``apply.Cluster`` call recorded as HTTP
  requests against a local server, the resources kopf watches from the handler registry, the rules of the per-job
  Role the operator grants) and fails when that is not a subset of ``NEEDS``; it also renders the chart and
  fails when its rules, per mode, are not exactly ``NEEDS``;
- ``e2e/test_rbac.py`` installs the chart and asks the API server (``kubectl auth can-i --as`` the chart's
  ServiceAccount) for every entry, in namespaced and in cluster-wide mode;
- ``e2e/installed.py`` compares the operator's own request counter (``kubeforge_operator_api_requests_total``)
  after a chart-installed run with ``NEEDS`` (``covers``).

Scopes (how the chart grants an entry):
- ``CLUSTER``: a cluster-scoped resource (nodes, Kueue's flavors and priority classes, CRDs, namespaces): a
  ClusterRole in both modes (a namespaced Role cannot grant it: the API server ignores such a rule);
- ``JOBS``: namespaced, in each watched namespace (one Role each) or, in cluster-wide mode, everywhere (ClusterRole);
- ``RELEASE``: the release namespace only (leader election's Lease; only when leader election is on);
- ``NODE_LEASES``: the namespace ``kube-node-lease`` only (the kubelets' heartbeats, read: docs/recovery.md), a
  Role there in both modes.
``SELF_REGISTERED`` is what the operator needs only when run outside the chart (it then manages its own webhook
configuration): the chart grants none of it.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable


class Scope(enum.Enum):
    CLUSTER = "cluster"
    JOBS = "jobs"
    RELEASE = "release"
    NODE_LEASES = "node-leases"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Need:
    """``verbs`` on ``group``/``resource`` (``plural`` or ``plural/subresource``) in ``scope``; ``why``: the code."""

    group: str
    resource: str
    verbs: frozenset[str]
    scope: Scope
    why: str


def _need(group: str, resource: str, verbs: str, scope: Scope, why: str) -> Need:
    return Need(group=group, resource=resource, verbs=frozenset(verbs.split()), scope=scope, why=why)


#: The verbs of an applied child: server-side apply (``patch``; ``create`` when absent), read by kopf's watch or by
#: the pass (``get list watch``), deleted when the job no longer wants it.
CHILD = "get list watch create patch delete"

NEEDS: tuple[Need, ...] = (
    # kopf (handlers.py): the watch streams, and its annotation storages on the RLJob
    _need("kubeforge.dev", "rljobs", "get list watch patch delete", Scope.JOBS,
          "kopf watches RLJobs and keeps its progress/diff-base annotations on them (patch); reconcile reads one "
          "(get_rljob) and deletes a finished one after ttlSecondsAfterFinished (delete_rljob)"),
    _need("kubeforge.dev", "rljobs/status", "get patch", Scope.JOBS, "the typed status, one merge patch per pass"),
    _need("kubeforge.dev", "generatorpools", "get list watch patch", Scope.JOBS,
          "kopf watches GeneratorPools; a pool pass reads one and patches its finalizer (poolreconcile); a job's pass "
          "and the admission webhook read the pool a job names (reconcile._pool_engines, admission.pool_problems); "
          "a pool pass lists the namespace's RLJobs to find the attached ones (list rljobs, above)"),
    _need("kubeforge.dev", "generatorpools/status", "get patch", Scope.JOBS, "a pool's status, one merge patch per "
          "pass that changes it"),
    _need("apps", "statefulsets", CHILD, Scope.JOBS, "the role StatefulSets (applied; kopf watches them)"),
    _need("", "services", CHILD, Scope.JOBS, "the job's headless Service"),
    _need("", "configmaps", CHILD, Scope.JOBS, "the job's config"),
    _need("", "serviceaccounts", CHILD, Scope.JOBS, "the job's runtime identity"),
    _need("networking.k8s.io", "networkpolicies", CHILD, Scope.JOBS, "the job's NetworkPolicy"),
    _need("rbac.authorization.k8s.io", "roles", CHILD, Scope.JOBS, "the job's Role (its pods, by name)"),
    _need("rbac.authorization.k8s.io", "rolebindings", CHILD, Scope.JOBS, "the job's RoleBinding"),
    _need("scheduling.x-k8s.io", "podgroups", CHILD, Scope.JOBS, "Coscheduling's PodGroup"),
    _need("scheduling.volcano.sh", "podgroups", CHILD, Scope.JOBS, "Volcano's PodGroup"),
    _need("scheduling.run.ai", "podgroups", CHILD, Scope.JOBS, "KAI's PodGroup"),
    _need("", "secrets", "create", Scope.JOBS, "the job key Secret: created once when absent, never read back"),
    _need("", "pods", "get list watch patch delete", Scope.JOBS,
          "kopf watches them, a pass lists them; patch: the export request copied onto trainer 0; delete: the "
          "forced delete of a pod lost with its node; get and patch are also what the per-job Role grants (RBAC "
          "lets one grant only what one holds)"),
    _need("", "events", "create", Scope.JOBS, "one Event per transition (and kopf's error events)"),
    _need("kueue.x-k8s.io", "workloads", CHILD, Scope.JOBS, "the job's Workload and its grow Workloads (queueing)"),
    _need("kueue.x-k8s.io", "workloads/status", "get patch", Scope.JOBS, "eviction released, Finished"),
    # cluster-scoped reads: a ClusterRole in both modes
    _need("", "nodes", "get", Scope.CLUSTER, "the Ready condition of a not-ready pod's node (nodeloss)"),
    _need("kueue.x-k8s.io", "resourceflavors", "get", Scope.CLUSTER,
          "an admitted flavor's node labels and tolerations (queueing)"),
    _need("kueue.x-k8s.io", "workloadpriorityclasses", "get", Scope.CLUSTER,
          "the priority named by kueue.x-k8s.io/priority-class (queueing)"),
    _need("", "namespaces", "list watch", Scope.CLUSTER, "kopf's scanning of namespaces"),
    _need("apiextensions.k8s.io", "customresourcedefinitions", "list watch", Scope.CLUSTER,
          "kopf's scanning of CRDs (it watches a resource once the cluster serves it: Kueue's workloads)"),
    # leader election (main.standby, leader.Elector)
    _need("coordination.k8s.io", "leases", "get", Scope.NODE_LEASES,
          "the kubelet's Lease of a silent generator's node, or of a quiet trainer's node and of the job's "
          "other nodes (a witness): has it answered since (peersilence, trainersilence)"),
    _need("coordination.k8s.io", "leases", "get create update delete", Scope.RELEASE,
          "the leader's Lease: read, created, renewed by PUT with the read resourceVersion, deleted on stop"),
)

#: Outside the chart only: ``kubeforge operator`` run from a shell serves and registers its own webhook.
SELF_REGISTERED: tuple[Need, ...] = (
    _need("admissionregistration.k8s.io", "validatingwebhookconfigurations", "get list watch create patch delete",
          Scope.CLUSTER, "kopf's self-managed webhook configuration, deleted on a clean exit (main.serve)"),
)

Key = tuple[str, str, str, Scope]          # verb, group, resource, scope


def flat(needs: Iterable[Need] = NEEDS) -> set[Key]:
    """One (verb, group, resource, scope) per verb of each need."""
    return {(v, n.group, n.resource, n.scope) for n in needs for v in n.verbs}


def request_verbs(method: str, content_type: str = "application/json") -> frozenset[str]:
    """The RBAC verbs a REST call needs (a collection GET is ``list``: see :func:`of_request`). Server-side apply is
    a PATCH that creates the object when it is absent, so it needs both."""
    if method == "PATCH" and content_type == "application/apply-patch+yaml":
        return frozenset({"create", "patch"})
    return frozenset({{"GET": "get", "POST": "create", "PUT": "update", "DELETE": "delete", "PATCH": "patch"}[method]})


def of_request(method: str, path: str, content_type: str = "application/json") -> set[tuple[str, str, str, bool]]:
    """(verb, group, resource, namespaced) for each RBAC verb one REST call needs, from its method and path
    (``/api/v1/...`` or ``/apis/<group>/<version>/...``, with ``namespaces/<ns>/`` for a namespaced object)."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    if not rest and method == "GET":
        return set()   # API discovery (``/apis/<group>/<version>``): every authenticated user may (system:discovery)
    namespaced = rest[:1] == ["namespaces"] and len(rest) >= 3
    if namespaced:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    verbs = request_verbs(method, content_type)
    if method == "GET" and len(rest) == 1:
        verbs = frozenset({"list"})
    return {(v, group, resource, namespaced) for v in verbs}


def covers(key: tuple[str, str, str, bool], needs: Iterable[Need] = NEEDS) -> bool:
    """Whether ``needs`` grant one (verb, group, resource, namespaced) of :func:`of_request`."""
    verb, group, resource, namespaced = key
    return any(verb in n.verbs and n.group == group and n.resource == resource
               and (n.scope is not Scope.CLUSTER) == namespaced for n in needs)
