"""Kueue: plain pod groups — no object of our own; every pod carries the group name and the group's size.

Kueue's pod integration admits the group once quota for all ``pod-group-total-count`` pods is free (gang
admission rather than gang scheduling). Rendered and golden-tested; not run in our test cluster.
"""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator import names
from kubeforge.operator.render import context
from kubeforge.operator.render.gang import base

LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_POD_GROUP = "kueue.x-k8s.io/pod-group-name"
ANNOTATION_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
DEFAULT_QUEUE = "default"


def render(job: rljob.RLJob, ctx: context.RenderContext) -> base.GangParts:
    return base.GangParts(
        pod_labels={LABEL_QUEUE: job.spec.gang.queue or DEFAULT_QUEUE,
                    LABEL_POD_GROUP: names.pod_group(job.metadata.name)},
        # Kueue's pod groups need the exact pod count (no minimum): every replica, generators included
        pod_annotations={ANNOTATION_TOTAL: str(sum(base.replicas(job).values()))})
