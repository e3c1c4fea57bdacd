"""KAI Scheduler (NVIDIA): a PodGroup ``scheduling.run.ai/v2alpha2`` with one sub-group per role.

Pods name their group with the ``pod-group-name`` annotation, their queue with the ``kai.scheduler/queue`` label and
their sub-group with ``kai.scheduler/subgroup-name``; ``schedulerName: kai-scheduler``. Rendered and
golden-tested; not run in our test cluster.
"""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta
from kubeforge.operator.render.gang import base

API_VERSION = "scheduling.run.ai/v2alpha2"
ANNOTATION_GROUP = "pod-group-name"
LABEL_QUEUE = "kai.scheduler/queue"
LABEL_SUBGROUP = "kai.scheduler/subgroup-name"
SCHEDULER = "kai-scheduler"
DEFAULT_QUEUE = "default-queue"


def render(job: rljob.RLJob, ctx: context.RenderContext) -> base.GangParts:
    name = names.pod_group(job.metadata.name)
    queue = job.spec.gang.queue or DEFAULT_QUEUE
    group = {
        "apiVersion": API_VERSION, "kind": "PodGroup", "metadata": meta.metadata(job, ctx, name=name),
        "spec": {"minMember": base.min_member(job), "queue": queue,
                 "subGroups": [{"name": r, "minMember": n} for r, n in base.minimums(job).items()]},
    }
    return base.GangParts(
        objects=(group,), pod_labels={LABEL_QUEUE: queue}, pod_annotations={ANNOTATION_GROUP: name},
        scheduler_name=SCHEDULER, role_labels={role: {LABEL_SUBGROUP: role} for role in base.replicas(job)},
        surplus_labels={LABEL_QUEUE: queue})   # a pod of no group: KAI's pod grouper makes it a group of its own
