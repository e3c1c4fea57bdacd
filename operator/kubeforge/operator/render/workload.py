"""Kueue's ``Workload`` for an RLJob labelled ``kueue.x-k8s.io/queue-name`` (``queueing``): one podSet per role.

Each podSet has the role's replica count and a pod template with what Kueue admits by: the containers' resource
requests (limits where no request is set, as the API server defaults a pod's), the role's nodeSelector and
tolerations (flavors must match them). Generators with ``minReplicas`` have it as ``minCount`` (partial
admission: Kueue may admit fewer, never fewer than the gang's minimum). The priority is the
WorkloadPriorityClass's value, resolved by the caller (``priority``). Owned by the RLJob.

``grow_workload``: one more generator beyond a partial admission (``queueing.growth``), pinned to the node labels
of the flavors the job's generators were admitted on (the generators share one pod template).
"""
from __future__ import annotations

from typing import Any

from kubeforge.api import rljob
from kubeforge.operator import names, queueing
from kubeforge.operator.render import context, meta


def _requests(spec: rljob.RoleSpec) -> dict[str, str]:
    out = {k: str(v) for k, v in spec.resources.limits.items()}
    out.update({k: str(v) for k, v in spec.resources.requests.items()})
    return dict(sorted(out.items()))


def pod_set(job: rljob.RLJob, ctx: context.RenderContext, role: str) -> meta.Obj:
    spec: rljob.RoleSpec = getattr(job.spec.roles, role)
    container: meta.Obj = {"name": role, "image": spec.image or ctx.image}
    if _requests(spec):
        container["resources"] = {"requests": _requests(spec)}
    pod: meta.Obj = {"containers": [container], "restartPolicy": "Always"}
    if spec.node_selector:
        pod["nodeSelector"] = dict(sorted(spec.node_selector.items()))
    if spec.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.tolerations]
    out: meta.Obj = {"name": role, "count": spec.replicas, "template": {"spec": pod}}
    if role == "generator" and job.spec.roles.generator.gang_held() < spec.replicas:
        out["minCount"] = job.spec.roles.generator.gang_held()
    return out


def _workload(job: rljob.RLJob, ctx: context.RenderContext, *, name: str, pod_sets: list[meta.Obj],
              priority: int | None) -> meta.Obj:
    wl_spec: dict[str, Any] = {"queueName": queueing.queue_name(job) or "", "podSets": pod_sets}
    pc = queueing.priority_class(job)
    if pc is not None and priority is not None:
        wl_spec["priorityClassRef"] = {"group": queueing.PRIORITY_GROUP, "kind": queueing.PRIORITY_KIND, "name": pc}
        wl_spec["priority"] = priority
    return {"apiVersion": queueing.API_VERSION, "kind": "Workload",
            "metadata": meta.metadata(job, ctx, name=name), "spec": wl_spec}


def workload(job: rljob.RLJob, ctx: context.RenderContext, *, priority: int | None = None) -> meta.Obj:
    """The Workload ``<job>`` in the job's namespace (``priority``: the WorkloadPriorityClass's value)."""
    return _workload(job, ctx, name=names.workload(job.metadata.name),
                     pod_sets=[pod_set(job, ctx, r) for r in job.spec.own_roles()], priority=priority)


def grow_workload(job: rljob.RLJob, ctx: context.RenderContext, ordinal: int, *, priority: int | None = None,
                  node_labels: dict[str, str] | None = None) -> meta.Obj:
    """The Workload ``<job>.generator-<ordinal>``: one generator, its nodeSelector joined by ``node_labels`` (the
    flavors' the job's generators run on), so Kueue can only assign it a flavor those pods fit."""
    ps = pod_set(job, ctx, "generator")
    ps.pop("minCount", None)
    ps["count"] = 1
    pod = ps["template"]["spec"]
    selector = {**pod.get("nodeSelector", {}), **(node_labels or {})}
    if selector:
        pod["nodeSelector"] = dict(sorted(selector.items()))
    return _workload(job, ctx, name=names.grow_workload(job.metadata.name, ordinal), pod_sets=[ps],
                     priority=priority)
