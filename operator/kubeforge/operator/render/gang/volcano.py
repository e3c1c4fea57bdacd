"""Volcano: a PodGroup ``scheduling.volcano.sh/v1beta1`` with per-role minimums (``minTaskMember``).

Pods name their group with the ``scheduling.k8s.io/group-name`` annotation and their task with
``volcano.sh/task-spec``; ``schedulerName: volcano``. Rendered and golden-tested; not run in our test cluster.
"""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta
from kubeforge.operator.render.gang import base

API_VERSION = "scheduling.volcano.sh/v1beta1"
ANNOTATION_GROUP = "scheduling.k8s.io/group-name"
ANNOTATION_TASK = "volcano.sh/task-spec"
SCHEDULER = "volcano"
ANNOTATION_QUEUE = "scheduling.volcano.sh/queue-name"   # a pod of no group: Volcano makes it a group of its own


def render(job: rljob.RLJob, ctx: context.RenderContext) -> base.GangParts:
    name = names.pod_group(job.metadata.name)
    spec: meta.Obj = {"minMember": base.min_member(job), "minTaskMember": base.minimums(job)}
    if job.spec.gang.queue:
        spec["queue"] = job.spec.gang.queue
    group = {"apiVersion": API_VERSION, "kind": "PodGroup", "metadata": meta.metadata(job, ctx, name=name),
             "spec": spec}
    return base.GangParts(
        objects=(group,), pod_annotations={ANNOTATION_GROUP: name}, scheduler_name=SCHEDULER,
        role_annotations={role: {ANNOTATION_TASK: role} for role in base.replicas(job)},
        surplus_annotations={ANNOTATION_QUEUE: job.spec.gang.queue} if job.spec.gang.queue else {})
