"""Failure policy: a failure of the current attempt restarts the whole job from its checkpoint, up to
``spec.failurePolicy.maxRestarts`` times; one more failure fails the job (``BackoffLimitExceeded``).

Why the whole job: generators, verifiers and the trainer share a weight-sync group and in-flight rollouts; one
member gone leaves the others blocked. Failures of older attempts are ignored (their pods are being torn down).
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import rljob
from kubeforge.operator import observed


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    restart: bool
    fail: bool
    failure: observed.Failure | None


NONE = Verdict(restart=False, fail=False, failure=None)


def current_failure(obs: observed.Observed, attempt: int) -> observed.Failure | None:
    """The first failure (by pod name) that belongs to ``attempt``, from listed pods or watch events."""
    found = [p.failure for p in obs.of_attempt(attempt) if p.failure is not None]
    found += [f for f in obs.seen_failures if f.attempt == attempt]
    return min(found, key=lambda f: (f.pod, f.reason)) if found else None


def judge(job: rljob.RLJob, obs: observed.Observed, *, attempt: int, restarts: int) -> Verdict:
    """Restart, fail, or carry on."""
    failure = current_failure(obs, attempt)
    if failure is None:
        return NONE
    if restarts < job.spec.failure_policy.max_restarts:
        return Verdict(restart=True, fail=False, failure=failure)
    return Verdict(restart=False, fail=True, failure=failure)
