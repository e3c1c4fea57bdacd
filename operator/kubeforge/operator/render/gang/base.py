"""What a gang backend contributes to a job's objects, and the helpers the backends share.

Role: the Protocol every backend module implements (a pure ``render(job, ctx) -> GangParts``). Neighbours:
``render.gang`` (the registry) picks the backend by ``spec.gang.backend``; ``render.statefulset`` stamps
``pod_labels``/``pod_annotations``/``scheduler_name`` on every pod; ``render.job`` decides whether ``objects`` are
desired (gang active) or must be absent (suspended, finished).
Invariants: one gang spans every role; its minimum is the sum of the per-role minimums (never one gang per role:
roles that wait on each other across gangs deadlock). Only the pods of that minimum are gang members: generators
beyond ``generator.minReplicas`` live in their own StatefulSet (``render.statefulset.surplus_statefulset``) that
carries ``surplus_labels``/``surplus_annotations`` instead of the gang's, so they can never count toward the gang.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

from kubeforge.api import rljob
from kubeforge.operator.render import context, meta


@dataclasses.dataclass(frozen=True, kw_only=True)
class GangParts:
    """A backend's contribution: its own objects plus what every pod of the job must carry."""

    objects: tuple[meta.Obj, ...] = ()
    pod_labels: dict[str, str] = dataclasses.field(default_factory=dict)
    pod_annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    scheduler_name: str | None = None
    #: per role: extra pod labels/annotations (e.g. the backend's task or sub-group name)
    role_labels: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    role_annotations: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    #: what the surplus generators carry instead (e.g. the backend's queue, but no group membership)
    surplus_labels: dict[str, str] = dataclasses.field(default_factory=dict)
    surplus_annotations: dict[str, str] = dataclasses.field(default_factory=dict)


class Backend(Protocol):
    """A gang backend: a pure function from the job to its gang parts."""

    def __call__(self, job: rljob.RLJob, ctx: context.RenderContext) -> GangParts: ...


def replicas(job: rljob.RLJob) -> dict[str, int]:
    """Replica count per role the job runs pods for (``RLJobSpec.own_roles``: no generators on a pool), in
    ``contract.ROLES`` order."""
    return {role: getattr(job.spec.roles, role).replicas for role in job.spec.own_roles()}


def minimums(job: rljob.RLJob) -> dict[str, int]:
    """Pods per role the gang holds the job for: every trainer and verifier, ``generator.minReplicas`` generators
    (default all; generators are elastic: those beyond the minimum are placed when they fit and join the running
    job)."""
    out = replicas(job)
    if "generator" in out:
        out["generator"] = job.spec.roles.generator.gang_held()
    return out


def surplus(job: rljob.RLJob) -> int:
    """Generators beyond the gang's minimum (0 when ``minReplicas`` is unset or equals ``replicas``, or the generators
    are a pool's)."""
    if "generator" not in job.spec.own_roles():
        return 0
    return job.spec.roles.generator.replicas - job.spec.roles.generator.gang_held()


def min_member(job: rljob.RLJob) -> int:
    """Pods that must be placed together: the per-role minimums."""
    return sum(minimums(job).values())
