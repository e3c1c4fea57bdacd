"""Lifecycle: from the job, its last status and the observed pods, decide this pass's facts (a ``Plan``).

Role: the pure "decide" step between observe and render. It answers: which attempt runs, should pods exist,
should the gang object exist, is the job over (and why), must a finished job be deleted now, and when must the
operator look again even if nothing happens (deadline, TTL). Policies live in their own modules
(``completion``, ``deadline``, ``ttl``, ``failure_policy``); this module only orders them.

Invariants:
- Succeeded and Failed are terminal: once written, nothing restarts the job.
- Two attempts never overlap: pods of attempt N+1 are wanted only once no pod of another attempt exists
  (``active`` is False while stale pods drain; their StatefulSets are rendered with 0 replicas).
- Surplus generators (beyond ``minReplicas``) get pods only once the gang is placed (``gang_placed``), so they
  never hold a gang member's place; they keep them for the attempt.
- A verifier replica change starts a new attempt that does not count as a restart; a generator replica change does
  not (generators are elastic: the StatefulSet follows ``spec.roles.generator.replicas`` and the running trainer
  re-forms the weight-sync group; its pods are never touched).
"""
from __future__ import annotations

import dataclasses
import datetime as dt

from kubeforge.api import contract, failures, progress, rljob
from kubeforge.operator import completion, deadline, failure_policy, fencing, names, observed, queueing, reasons
from kubeforge.operator import timefmt, ttl
from kubeforge.operator.render import statefulset
from kubeforge.operator.render.gang import base as gang_base

Phase = rljob.Phase


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    attempt: int
    restarts: int
    suspended: bool
    active: bool                       # pods of ``attempt`` should exist now
    gang_active: bool                  # the gang object should exist now
    draining: bool                     # pods of another attempt still exist
    terminal: str | None               # Phase.SUCCEEDED / Phase.FAILED value, or None
    terminal_reason: str = ""
    terminal_message: str = ""
    new_attempt_reason: str | None = None   # reasons.RESTARTING / reasons.RESCALED when this pass bumped it
    new_failure: observed.Failure | None = None
    decision: failures.Decision | None = None
    last_failure: rljob.FailureInfo | None = None
    role_restarts: dict[str, int] = dataclasses.field(default_factory=dict)   # counted restarts by role
    handled: dict[str, str] = dataclasses.field(default_factory=dict)         # status.handledFailures
    progress: rljob.Progress = dataclasses.field(default_factory=rljob.Progress)
    start_time: str | None = None
    completion_time: str | None = None
    last_progress_time: str | None = None
    stalled_for: float | None = None       # seconds without progress beyond progressDeadlineSeconds (else None)
    delete_job: bool = False
    requeue_after: float | None = None
    surplus_active: bool = True            # the surplus generators may have pods (``gang_placed``)
    queue: queueing.Gate | None = None     # a Kueue workload's gate (None: not labelled with a queue)
    held_by_queue: bool = False            # suspended only because Kueue has not admitted it (or evicted it)
    surplus_present: bool = False          # pods of the surplus StatefulSet exist (any attempt)
    trainer_epoch: int = fencing.FIRST     # status.trainerEpoch: what trainer pods created now carry
    fenced_writes: rljob.FencedWrites = dataclasses.field(default_factory=rljob.FencedWrites)


def is_surplus(job: rljob.RLJob, pod: observed.PodFacts) -> bool:
    """``pod`` belongs to the surplus generators' StatefulSet (not a gang member)."""
    return pod.name.startswith(contract.surplus_generators(job.metadata.name) + "-")


def gang_pods(job: rljob.RLJob, obs: observed.Observed, attempt: int) -> list[observed.PodFacts]:
    """The gang members of ``attempt`` (not terminating, not surplus generators)."""
    return [p for p in obs.of_attempt(attempt) if not p.terminating and not is_surplus(job, p)]


def gang_placed(job: rljob.RLJob, obs: observed.Observed, attempt: int) -> bool:
    """Every gang-held pod of ``attempt`` is bound to a node, or surplus generators of it already have pods (once
    let in, they stay for the attempt: a gang member restarting alone does not scale them away)."""
    if any(is_surplus(job, p) and not p.terminating for p in obs.of_attempt(attempt)):
        return True
    bound = [p for p in gang_pods(job, obs, attempt) if p.scheduled]
    return all(sum(p.role == r for p in bound) >= n for r, n in gang_base.minimums(job).items())


def trainer_report(job: rljob.RLJob, obs: observed.Observed,
                   attempt: int) -> tuple[progress.ProgressReport | None, str | None]:
    """Progress reported on trainer rank 0's pod of the current attempt, unless a stale trainer epoch wrote it; and
    then that report's identity (``fencing.screen``)."""
    rank0 = names.pod(job.metadata.name, "trainer", 0)
    for p in obs.of_attempt(attempt):
        if p.name == rank0 and p.progress is not None:
            return fencing.screen(p)
    return None, None


def _progress(report: progress.ProgressReport | None, prev: rljob.Progress) -> rljob.Progress:
    return prev if report is None else report.status(prev)


def _failure_info(f: observed.Failure, action: str, now: dt.datetime) -> rljob.FailureInfo:
    return rljob.FailureInfo(role=f.role, pod=f.pod, exit_code=f.exit_code, reason=f.reason, action=action,
                             attempt=f.attempt, time=f.time or timefmt.fmt(now), node=f.node)


def _rescaled(job: rljob.RLJob, obs: observed.Observed, attempt: int) -> bool:
    want = statefulset.world(job)
    return any(p.world is not None and p.world != want for p in obs.of_attempt(attempt))


def _prev_terminal(prev: rljob.RLJobStatus) -> tuple[str | None, str, str]:
    if prev.phase not in (Phase.SUCCEEDED.value, Phase.FAILED.value):
        return None, "", ""
    kind = reasons.COMPLETE if prev.phase == Phase.SUCCEEDED.value else reasons.FAILED
    for c in prev.conditions:
        if c.type == kind:
            return prev.phase, c.reason, c.message
    return prev.phase, "", ""


def _min(*values: float | None) -> float | None:
    present = [max(v, 0.0) for v in values if v is not None]
    return min(present) if present else None


def decide(job: rljob.RLJob, obs: observed.Observed, *, now: dt.datetime,
           queue: queueing.Gate | None = None) -> Plan:
    """This pass's facts for ``job`` (its ``status`` is the previous pass's result); ``queue``: Kueue's gate for a
    job labelled with a queue (not admitted: treated as suspended, its pods go and its deadline does not run)."""
    prev = job.status or rljob.RLJobStatus()
    attempt, restarts = prev.attempt, prev.restarts
    terminal, t_reason, t_message = _prev_terminal(prev)
    report, stale_report = trainer_report(job, obs, attempt)
    progress = _progress(report, prev.progress)
    fresh: list[observed.Failure] = []
    start_time, completion_time = prev.start_time, prev.completion_time
    last_failure, new_failure, new_reason = prev.last_failure, None, None
    decision: failures.Decision | None = None
    handled = dict(prev.handled_failures)
    role_restarts = {r: s.restarts for r, s in prev.roles.items() if s.restarts}
    queued = queue is not None and not queue.admitted
    suspended = (job.spec.suspend or queued) and terminal is None

    if terminal is None and not suspended:
        left = deadline.remaining(job, start_time, now)
        decision, fresh = failure_policy.judge(job, obs, attempt=attempt, restarts=restarts, handled=handled)
        if completion.done(job, report):
            terminal, t_reason = Phase.SUCCEEDED.value, reasons.TRAINING_COMPLETE
            t_message = f"trainer reported step {progress.step} of {job.spec.algorithm.steps}"
        elif left is not None and left <= 0:
            terminal, t_reason = Phase.FAILED.value, reasons.DEADLINE_EXCEEDED
            t_message = f"job ran longer than activeDeadlineSeconds={job.spec.active_deadline_seconds}"
        elif decision is not None and decision.cause is not None:
            new_failure = next(f for f in fresh if f.pod == decision.cause.name)
            last_failure = _failure_info(new_failure, decision.action, now)
            handled.update({f.pod: f.ident for f in fresh})
            if decision.counts:
                restarts += 1
                role_restarts[new_failure.role] = role_restarts.get(new_failure.role, 0) + 1
            if decision.action == failures.RESTART_ALL:
                attempt, new_reason, handled = attempt + 1, reasons.RESTARTING, {}
            elif decision.action == failures.RESTART_ROLE:
                pass   # the kubelet / StatefulSet controller bring the failed pods back; see failure_policy
            elif decision.action == failures.FAIL:
                terminal, t_reason, t_message = Phase.FAILED.value, decision.reason, decision.message
        elif _rescaled(job, obs, attempt):
            attempt, new_reason = attempt + 1, reasons.RESCALED
        if terminal is not None:
            completion_time = timefmt.fmt(now)

    trainer_epoch = fencing.epoch(prev.trainer_epoch, new_attempt=new_reason is not None, fresh=fresh)
    draining = bool(obs.stale(attempt))
    active = terminal is None and not suspended and not draining
    if suspended:
        start_time = None      # as for a Job: the deadline restarts on resume
    elif active and start_time is None:
        start_time = timefmt.fmt(now)
    last_progress = prev.last_progress_time
    if not active or new_reason is not None or progress.step != prev.progress.step or last_progress is None:
        last_progress = timefmt.fmt(now)      # not running, a new attempt, a step moved: the clock starts again
    since = timefmt.parse(last_progress)
    idle = (now - since).total_seconds() if since is not None else 0.0
    limit = float(stall_limit(job, progress))
    stalled_for = idle if active and idle > limit else None
    stall_left = limit - idle + 1.0 if active and stalled_for is None else None
    ttl_left = ttl.remaining(job, completion_time, now) if terminal else None
    deadline_left = deadline.remaining(job, start_time, now) if terminal is None and not suspended else None
    return Plan(
        attempt=attempt, restarts=restarts, suspended=suspended, active=active,
        gang_active=terminal is None and not suspended, draining=draining,
        terminal=terminal, terminal_reason=t_reason, terminal_message=t_message,
        new_attempt_reason=new_reason, new_failure=new_failure, decision=decision, last_failure=last_failure,
        role_restarts=role_restarts, handled=handled, progress=progress,
        start_time=start_time, completion_time=completion_time, last_progress_time=last_progress,
        stalled_for=stalled_for,
        delete_job=ttl_left is not None and ttl_left <= 0,
        requeue_after=_min(ttl_left, deadline_left, stall_left),
        surplus_active=active and gang_placed(job, obs, attempt),
        queue=queue, held_by_queue=suspended and not job.spec.suspend,
        surplus_present=any(is_surplus(job, p) for p in obs.pods),
        trainer_epoch=trainer_epoch,
        fenced_writes=fencing.counted(prev.fenced_writes, report=report, stale=stale_report),
    )


def stall_limit(job: rljob.RLJob, progress: rljob.Progress) -> int:
    """Seconds the trainer's step may stand still before the job is Stalled: progressDeadlineSeconds, and before
    the first step the start allowance (``start_deadline_seconds()``: the roles are starting, vLLM engines load)."""
    policy = job.spec.failure_policy
    return policy.progress_deadline_seconds if progress.step > 0 else policy.start_deadline_seconds()


__all__ = ["Plan", "decide", "gang_placed", "gang_pods", "is_surplus", "stall_limit"]
