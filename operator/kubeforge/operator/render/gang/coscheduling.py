"""Coscheduling (kubernetes-sigs/scheduler-plugins): one PodGroup ``scheduling.x-k8s.io/v1alpha1`` per job.

Pods join the group through the ``scheduling.x-k8s.io/pod-group`` label; the scheduler holds every pod at Permit
until ``minMember`` of them fit, and gives the group up after ``scheduleTimeoutSeconds``. Runs in the test cluster.
"""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta
from kubeforge.operator.render.gang import base

API_VERSION = "scheduling.x-k8s.io/v1alpha1"
LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"


def render(job: rljob.RLJob, ctx: context.RenderContext) -> base.GangParts:
    name = names.pod_group(job.metadata.name)
    group = {
        "apiVersion": API_VERSION, "kind": "PodGroup",
        "metadata": meta.metadata(job, ctx, name=name),
        "spec": {"minMember": base.min_member(job),
                 "scheduleTimeoutSeconds": job.spec.gang.schedule_timeout_seconds},
    }
    # the scheduler the operator was told serves PodGroups (unset: the cluster's default scheduler must)
    return base.GangParts(objects=(group,), pod_labels={LABEL_POD_GROUP: name},
                          scheduler_name=ctx.coscheduling_scheduler or None)
