"""Failure policy on a cluster: the failures of the current attempt not acted on yet, judged by the one pure
decision of ``kubeforge.api.failures`` (the local launcher uses the same).

What each action does here (``lifecycle`` applies it):
- ``RestartAll``: a new attempt; every pod of the old one goes before any pod of the new one starts, and the
  trainers resume from the last complete checkpoint.
- ``RestartRole``: counted; the failed pods alone come back (the kubelet restarts a failed container in place,
  the StatefulSet controller re-creates a Failed or lost pod); the other pods, the trainer's above all, are
  untouched and the trainer re-forms the weight-sync group when the generator is back.
- ``Ignore``: not counted; the pod comes back the same way.
- ``Fail``: the job fails with the rule's reason, or ``BackoffLimitExceeded`` when restarts are used up.

Invariant: a failure is acted on once. ``status.handledFailures`` remembers, per pod, the failure last acted
on; a pod keeps showing its last termination until the next one, and a restarted operator reads the same
status, so replaying a pass never counts a restart twice.
"""
from __future__ import annotations

from kubeforge.api import failures, rljob
from kubeforge.operator import observed


def new_failures(obs: observed.Observed, attempt: int, handled: dict[str, str]) -> list[observed.Failure]:
    """Failures of ``attempt`` (listed pods and watch events) not acted on yet: the newest per pod."""
    found: dict[str, observed.Failure] = {}
    for f in [p.failure for p in obs.of_attempt(attempt) if p.failure is not None] + [
            f for f in obs.seen_failures if f.attempt == attempt]:
        if handled.get(f.pod) != f.ident and f.pod not in found:
            found[f.pod] = f
    return [found[k] for k in sorted(found)]


def as_api(f: observed.Failure) -> failures.Failure:
    return failures.Failure(role=f.role, name=f.pod, exit_code=f.exit_code, reason=f.reason)


def scaled_away(job: rljob.RLJob, f: observed.Failure) -> bool:
    """A generator pod past ``spec.roles.generator.replicas`` was deleted by a scale-down: however it ended (a
    SIGKILL after its grace period reads as exit code 137), that is no failure of the job."""
    if f.role != "generator":
        return False
    index = f.pod.rsplit("-", 1)[-1]
    return index.isdigit() and int(index) >= job.spec.roles.generator.replicas


def judge(job: rljob.RLJob, obs: observed.Observed, *, attempt: int, restarts: int,
          handled: dict[str, str]) -> tuple[failures.Decision | None, list[observed.Failure]]:
    """The decision for the new failures of ``attempt`` (None: nothing new), and those failures; the end of a
    generator scaled away is none."""
    fresh = [f for f in new_failures(obs, attempt, handled) if not scaled_away(job, f)]
    return failures.decide(job.spec.failure_policy, [as_api(f) for f in fresh], restarts=restarts), fresh
