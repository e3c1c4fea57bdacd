"""``gang.backend: Auto``: which gang a job gets, decided from observed facts (pure).

Role: between observe and render. ``reconcile`` gathers the facts (the job's Kueue queue label, whether the API
server serves PodGroups, the operator's ``--coscheduling-scheduler-name``) and passes the choice to the renderers
as ``RenderContext.gang_backend`` and to the status as the ``GangScheduling`` condition (an event when it is
first set). The order, and why (docs/operator.md, "gang.backend: Auto"):

  queue label kueue.x-k8s.io/queue-name on the RLJob ─▶ Kueue: it admits the whole job at once (its Workload);
                                                         no pod-level gang object (pod groups would admit twice)
  PodGroup API served AND a scheduler named for it    ─▶ Coscheduling (a PodGroup; schedulerName that scheduler)
  otherwise                                           ─▶ None (pods scheduled one by one)

A served PodGroup CRD alone is not enough: the CRD can exist with no scheduler running the Coscheduling plugin
(a leftover install, or scheduler-plugins as a second scheduler the pods would not name), and then every gang
waits forever. Only the cluster's admin knows which scheduler serves it, so the operator is told (the chart value
``gang.coschedulingSchedulerName``).

Invariant: the choice is made once per job and kept (read back from its condition): a cluster that starts or
stops serving PodGroups later never moves a running job's pods to another scheduler. Delete and re-create the
job to decide again.
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import contract, rljob
from kubeforge.operator import queueing, reasons

#: The API the Coscheduling backend needs (group/version) and the resource it must list.
PODGROUP_API = "scheduling.x-k8s.io/v1alpha1"
PODGROUP_RESOURCE = "podgroups"

_BACKEND_OF_REASON = {
    reasons.AUTO_CHOSE_KUEUE: rljob.GangBackend.NONE.value,     # Kueue's admission is the gang; pods carry none
    reasons.AUTO_CHOSE_COSCHEDULING: rljob.GangBackend.COSCHEDULING.value,
    reasons.AUTO_CHOSE_NONE: rljob.GangBackend.NONE.value,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Choice:
    """What Auto chose for one job: the pod-level backend rendered, and the condition that says why."""

    backend: str          # Coscheduling | None (the renderers' ``ctx.gang_backend``)
    reason: str           # reasons.AUTO_CHOSE_*
    message: str

    @property
    def gang(self) -> bool:
        """A gang holds the job (Kueue's admission or a PodGroup): the condition's status."""
        return self.reason != reasons.AUTO_CHOSE_NONE


def is_auto(job: rljob.RLJob) -> bool:
    return str(job.spec.gang.backend) == rljob.GangBackend.AUTO.value


def kept(job: rljob.RLJob) -> Choice | None:
    """The choice recorded in the job's status by an earlier pass (None: not made yet)."""
    for c in (job.status.conditions if job.status else []):
        if c.type == reasons.GANG_SCHEDULING and c.reason in _BACKEND_OF_REASON:
            return Choice(backend=_BACKEND_OF_REASON[c.reason], reason=c.reason, message=c.message)
    return None


def choose(job: rljob.RLJob, *, podgroups_served: bool, coscheduling_scheduler: str) -> Choice:
    """Auto's choice for ``job`` from the facts (see the module docstring for the order)."""
    queue = queueing.queue_name(job)
    if queue is not None:
        return Choice(backend=_BACKEND_OF_REASON[reasons.AUTO_CHOSE_KUEUE], reason=reasons.AUTO_CHOSE_KUEUE,
                      message=f"the RLJob carries the label {contract.LABEL_KUEUE_QUEUE}={queue}: Kueue admits the "
                      "whole job at once (its Workload); its pods carry no gang object of their own")
    if podgroups_served and coscheduling_scheduler:
        return Choice(backend=rljob.GangBackend.COSCHEDULING.value, reason=reasons.AUTO_CHOSE_COSCHEDULING,
                      message=f"the cluster serves {PODGROUP_RESOURCE}.{PODGROUP_API.split('/')[0]} and the "
                      f"operator names {coscheduling_scheduler!r} as the scheduler serving them "
                      "(gang.coschedulingSchedulerName): one PodGroup, every pod with that schedulerName")
    why = (f"the cluster serves {PODGROUP_RESOURCE}.{PODGROUP_API.split('/')[0]} but the operator names no "
           "scheduler serving them (the chart value gang.coschedulingSchedulerName)" if podgroups_served else
           f"the cluster serves no {PODGROUP_RESOURCE}.{PODGROUP_API.split('/')[0]} API (scheduler-plugins is not "
           "installed)")
    return Choice(backend=rljob.GangBackend.NONE.value, reason=reasons.AUTO_CHOSE_NONE,
                  message=f"{why}, and the RLJob carries no {contract.LABEL_KUEUE_QUEUE} label: no gang, the pods "
                  "are scheduled one by one (a partial job can start and wait for the rest)")
