"""Status: the RLJob's observed state, computed (pure) from the plan and the pods, then written once per pass.

Role: the "status" step of observe → render → apply → status → write. Neighbours: ``lifecycle`` supplies the
plan; ``reconcile`` writes the result only when it differs from the stored status and posts ``transitions`` as
events after the write. Invariants:
- phases: Pending (the gang is not placed yet) → Starting (placed, not all ready) → Running (all ready);
  Restarting (an older attempt drains); Suspended; Succeeded / Failed (terminal);
- every condition carries ``observedGeneration``; ``lastTransitionTime`` moves only when its status flips;
- per-role counts and the gang's state come from pods of the current attempt only.
"""
from __future__ import annotations

import dataclasses
import datetime as dt

from kubeforge.api import failures, rljob
from kubeforge.operator import gangauto, lifecycle, observed, reasons, recovery, timefmt
from kubeforge.operator.render.gang import base as gang_base

Phase = rljob.Phase
Cond = tuple[bool, str, str]   # status, reason, message


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """A Kubernetes event to post after the status write."""

    type: str      # Normal | Warning
    reason: str
    message: str


def role_statuses(job: rljob.RLJob, obs: observed.Observed, plan: lifecycle.Plan) -> dict[str, rljob.RoleStatus]:
    """Desired, ready and restarted pods per role in the current attempt."""
    pods = [p for p in obs.of_attempt(plan.attempt) if not p.terminating]
    out = {}
    for role in job.spec.own_roles():       # a pool's engines are the pool's status (GeneratorPool.status)
        mine = [p for p in pods if p.role == role]
        out[role] = rljob.RoleStatus(
            replicas=getattr(job.spec.roles, role).replicas if plan.active else 0,
            ready=sum(p.ready for p in mine), restarts=plan.role_restarts.get(role, 0),
            container_restarts=sum(p.restarts for p in mine))
    return out


def gang_condition(job: rljob.RLJob, obs: observed.Observed, plan: lifecycle.Plan) -> Cond:
    """Is every pod of the current attempt bound to a node?"""
    if plan.terminal:
        return False, reasons.FINISHED, "the job is finished; nothing is scheduled"
    if plan.held_by_queue and plan.queue is not None:
        return False, plan.queue.reason, f"not admitted by Kueue; no pod is created ({plan.queue.message})"[:1000]
    if plan.suspended:
        return False, reasons.JOB_SUSPENDED, "the job is suspended; the gang is released"
    pods = lifecycle.gang_pods(job, obs, plan.attempt)    # surplus generators waiting for room are no gang matter
    stuck = [p for p in pods if p.unschedulable]
    if stuck:
        return False, reasons.UNSCHEDULABLE, f"{len(stuck)} pods unschedulable: {stuck[0].unschedulable}"
    want = gang_base.min_member(job)
    placed = sum(p.scheduled for p in pods)
    if plan.active and placed >= want:
        return True, reasons.SCHEDULED, f"all {want} pods are bound to nodes"
    return False, reasons.WAITING_FOR_PODS, f"{placed}/{want} pods bound to nodes"


def ready_condition(roles: dict[str, rljob.RoleStatus], plan: lifecycle.Plan,
                    obs: observed.Observed | None = None) -> Cond:
    lagging = [f"{r} {s.ready}/{s.replicas}" for r, s in roles.items() if s.ready < s.replicas]
    if plan.active and not lagging:
        return True, reasons.ALL_ROLES_READY, "every role has all replicas ready"
    stuck = [p for p in (obs.of_attempt(plan.attempt) if obs else []) if p.stuck and not p.ready]
    if plan.active and stuck:   # say why, with the kubelet's reason (ImagePullBackOff, CreateContainerError, ...)
        reason, message = stuck[0].stuck  # type: ignore[misc]
        return False, reason, f"pod {stuck[0].name} {message}"[:1000]
    return False, reasons.ROLES_NOT_READY, ", ".join(lagging) or "no pods are wanted now"


def serving(job: rljob.RLJob, roles: dict[str, rljob.RoleStatus], plan: lifecycle.Plan) -> bool:
    """Every role has at least its gang minimum ready (extra generators may still be starting: the job runs)."""
    mins = gang_base.minimums(job)
    return plan.active and all(s.ready >= mins[r] for r, s in roles.items())


#: Kueue gate reasons that leave a job Pending (waiting to be admitted), not Suspended (admitted once, then evicted)
QUEUED_REASONS = frozenset({reasons.QUEUED, reasons.QUEUE_INVALID})

#: Event type per Kueue gate reason (an event goes out when the Admitted condition's reason changes)
_QUEUE_EVENT = {reasons.QUEUED: "Normal", reasons.QUOTA_ADMITTED: "Normal", reasons.PREEMPTED: "Warning",
                reasons.EVICTED: "Warning", reasons.QUEUE_INVALID: "Warning"}


def phase_of(plan: lifecycle.Plan, gang: Cond, ready: Cond) -> str:
    if plan.terminal:
        return plan.terminal
    if plan.suspended:
        waiting = plan.held_by_queue and plan.queue is not None and plan.queue.reason in QUEUED_REASONS
        return Phase.PENDING.value if waiting else Phase.SUSPENDED.value
    if plan.draining:
        return Phase.RESTARTING.value
    if ready[0]:
        return Phase.RUNNING.value
    if gang[0]:
        return Phase.STARTING.value
    return Phase.PENDING.value


def _conditions(job: rljob.RLJob, plan: lifecycle.Plan, gang: Cond, ready: Cond,
                choice: gangauto.Choice | None = None) -> dict[str, Cond]:
    suspended: Cond = (False, reasons.NOT_SUSPENDED, "")
    if plan.held_by_queue and plan.queue is not None:
        suspended = (True, plan.queue.reason, plan.queue.message[:1000])
    elif plan.suspended:
        suspended = (True, reasons.JOB_SUSPENDED, "spec.suspend is true")
    out = {reasons.GANG_SCHEDULED: gang, reasons.READY: ready, reasons.SUSPENDED: suspended}
    if choice is not None:
        out[reasons.GANG_SCHEDULING] = (choice.gang, choice.reason, choice.message[:1000])
    if plan.queue is not None and not plan.terminal:
        out[reasons.ADMITTED] = (plan.queue.admitted, plan.queue.reason, plan.queue.message[:1000])
    limit = lifecycle.stall_limit(job, plan.progress)
    out[reasons.STALLED] = ((True, reasons.NO_PROGRESS, f"the trainer's step has not moved for "
                             f"{plan.stalled_for:.0f}s (limit {limit}s: progressDeadlineSeconds="
                             f"{job.spec.failure_policy.progress_deadline_seconds}, 3 times that before the "
                             "first step)")
                            if plan.stalled_for is not None else (False, reasons.PROGRESSING, ""))
    if plan.terminal == Phase.SUCCEEDED.value:
        out[reasons.COMPLETE] = (True, plan.terminal_reason, plan.terminal_message)
    if plan.terminal == Phase.FAILED.value:
        out[reasons.FAILED] = (True, plan.terminal_reason, plan.terminal_message)
    return out


def merge_conditions(prev: list[rljob.Condition], new: dict[str, Cond], *, generation: int | None,
                     now: dt.datetime) -> list[rljob.Condition]:
    """Conditions in a stable order; a condition's transition time moves only when its status flips."""
    old = {c.type: c for c in prev}
    out = []
    for kind, (ok, reason, message) in new.items():
        status = "True" if ok else "False"
        before = old.get(kind)
        when = before.last_transition_time if before and before.status == status else timefmt.fmt(now)
        out.append(rljob.Condition(type=kind, status=status, reason=reason, message=message,
                                   last_transition_time=when, observed_generation=generation))
    return out


def compute(job: rljob.RLJob, obs: observed.Observed, plan: lifecycle.Plan, *, generation: int | None,
            now: dt.datetime, gang_choice: gangauto.Choice | None = None) -> rljob.RLJobStatus:
    """The status to store for this pass (``gang_choice``: what ``gang.backend: Auto`` chose, for its condition)."""
    prev = job.status or rljob.RLJobStatus()
    roles = role_statuses(job, obs, plan)
    gang, ready = gang_condition(job, obs, plan), ready_condition(roles, plan, obs)
    running: Cond = (serving(job, roles, plan), ready[1], ready[2])
    ready_roles = sum(1 for s in roles.values() if s.replicas and s.ready >= s.replicas)
    return rljob.RLJobStatus(
        phase=phase_of(plan, gang, running), observed_generation=generation,
        conditions=merge_conditions(prev.conditions, _conditions(job, plan, gang, ready, gang_choice),
                                    generation=generation, now=now),
        roles=roles, ready=f"{ready_roles}/{len(roles)}", restarts=plan.restarts, attempt=plan.attempt,
        trainer_epoch=plan.trainer_epoch, fenced_writes=plan.fenced_writes,
        last_failure=plan.last_failure, handled_failures=plan.handled, progress=plan.progress,
        last_progress_time=plan.last_progress_time, start_time=plan.start_time,
        completion_time=plan.completion_time,
        recovery_breakdown=recovery.track(prev.recovery_breakdown, failure=plan.new_failure, pods=obs.pods,
                                          attempt=plan.attempt, report=lifecycle.trainer_report(
                                              job, obs, plan.attempt)[0], step=plan.progress.step, now=now),
    )


def substance(s: rljob.RLJobStatus | None) -> object:
    """The part of a status that must reach the API server at once: everything but the detail that only follows
    pods along (per-role counts, the printer column, the conditions' messages, a False GangScheduled's placement
    reason: ``PLACEMENT_REASONS``). Two statuses with the same
    substance differ in detail only, and ``reconcile`` may hold such a write back for a while (``StatusPacer``)."""
    if s is None:
        return None
    doc = s.model_dump(mode="json", by_alias=True, exclude={"roles", "ready", "conditions"})
    doc["conditions"] = [(c.type, c.status, _paced_reason(c), c.observed_generation) for c in s.conditions]
    if s.phase == Phase.RESTARTING.value:
        # draining: every pass restarts the stall clock (``lifecycle``), one write per pod gone (16 writes per
        # restarted job of 10 pods were measured); the restart itself and the next attempt's start are written at
        # once, so the clock starts at most one pacing interval before the drain ended
        doc.pop("lastProgressTime", None)
    return doc


#: False conditions whose reason only follows pods being created and placed: while such a condition stays False its
#: reason is detail. While a gang is created, the scheduler marks each pod Unschedulable until the whole gang is
#: there, so GangScheduled can flip WaitingForPods <-> Unschedulable with every pod created and bound (about 12
#: status writes per restarted job of 10 pods were measured in recovery before this). The flip to True
#: (Scheduled) changes the status, which is substance, and a phase change goes out at once anyway.
PLACEMENT_REASONS = {reasons.GANG_SCHEDULED: frozenset({reasons.WAITING_FOR_PODS, reasons.UNSCHEDULABLE})}


def _paced_reason(c: rljob.Condition) -> str | None:
    return None if c.status == "False" and c.reason in PLACEMENT_REASONS.get(c.type, ()) else c.reason


def apply_failed(job: rljob.RLJob, message: str, *, generation: int | None, now: dt.datetime) -> rljob.RLJobStatus:
    """The stored status plus a False ``ChildrenApplied`` condition carrying the API server's refusal (the next
    pass that applies everything computes conditions afresh, so the condition goes with the cause)."""
    prev = job.status or rljob.RLJobStatus()
    keep = {c.type: (c.status == "True", c.reason, c.message) for c in prev.conditions
            if c.type != reasons.CHILDREN_APPLIED}
    conds = merge_conditions(prev.conditions, {**keep, reasons.CHILDREN_APPLIED: (False, reasons.APPLY_FAILED,
                                                                                  message[:1000])},
                             generation=generation, now=now)
    return prev.model_copy(update={"conditions": conds})


_PHASE_EVENT = {
    Phase.PENDING.value: ("Normal", reasons.PHASE_PENDING), Phase.STARTING.value: ("Normal", reasons.PHASE_STARTING),
    Phase.RUNNING.value: ("Normal", reasons.PHASE_RUNNING),
    Phase.RESTARTING.value: ("Warning", reasons.PHASE_RESTARTING),
    Phase.SUSPENDED.value: ("Normal", reasons.PHASE_SUSPENDED),
    Phase.SUCCEEDED.value: ("Normal", reasons.PHASE_SUCCEEDED), Phase.FAILED.value: ("Warning", reasons.PHASE_FAILED),
}


def transitions(prev: rljob.RLJobStatus | None, new: rljob.RLJobStatus, plan: lifecycle.Plan) -> list[Event]:
    """Events for this pass: a failure seen, a new attempt, Auto's gang choice, Kueue's gate, a phase change (in
    that order)."""
    out = []
    if plan.new_failure is not None:
        f = plan.new_failure
        if f.reason == failures.PREEMPTED:
            out.append(Event(type="Warning", reason=reasons.PREEMPTED,
                             message=f"{f.role} pod {f.pod} preempted for a pod of higher priority: the job "
                                     "restarts per spec.failurePolicy, not counted against maxRestarts"))
        else:
            out.append(Event(type="Warning", reason=reasons.CONTAINER_FAILED,
                             message=f"{f.role} pod {f.pod} failed: exit code {f.exit_code}, reason {f.reason}"))
    if plan.decision is not None and plan.decision.action in (failures.RESTART_ROLE, failures.IGNORE):
        out.append(Event(type="Warning" if plan.decision.counts else "Normal",
                         reason=reasons.ROLE_RESTARTED if plan.decision.counts else reasons.FAILURE_IGNORED,
                         message=plan.decision.message))
    if plan.new_attempt_reason:
        out.append(Event(type="Warning" if plan.new_attempt_reason == reasons.RESTARTING else "Normal",
                         reason=plan.new_attempt_reason,
                         message=f"starting attempt {plan.attempt} (restart {plan.restarts})"))
    ready = next((c for c in new.conditions if c.type == reasons.READY), None)
    before = next((c.reason for c in (prev.conditions if prev else []) if c.type == reasons.READY), None)
    if ready is not None and ready.reason in observed.STUCK_REASONS and ready.reason != before:
        out.append(Event(type="Warning", reason=ready.reason, message=ready.message))
    chose = next((c for c in new.conditions if c.type == reasons.GANG_SCHEDULING), None)
    chose_before = next((c.reason for c in (prev.conditions if prev else []) if c.type == reasons.GANG_SCHEDULING),
                        None)
    if chose is not None and chose.reason != chose_before:     # once: the choice is kept (gangauto.kept)
        out.append(Event(type="Normal", reason=chose.reason, message=chose.message))
    queue = next((c for c in new.conditions if c.type == reasons.ADMITTED), None)
    queue_before = next((c.reason for c in (prev.conditions if prev else []) if c.type == reasons.ADMITTED), None)
    if queue is not None and queue.reason != queue_before:
        out.append(Event(type=_QUEUE_EVENT.get(queue.reason, "Normal"), reason=queue.reason, message=queue.message))
    if prev is None or prev.phase != new.phase:
        kind, reason = _PHASE_EVENT[new.phase]
        detail = next((c.message for c in new.conditions if c.type in (reasons.COMPLETE, reasons.FAILED)), "")
        out.append(Event(type=kind, reason=reason, message=f"phase {new.phase}" + (f": {detail}" if detail else "")))
    return out
