"""Kueue admission of an RLJob, the pure half: the Workload's facts, the gate, the job as admitted, and the status
patches an integration owes Kueue.

An RLJob labelled ``kueue.x-k8s.io/queue-name`` is a Kueue workload (``render.workload`` renders its ``Workload``:
one podSet per role). Its pods exist only while Kueue admits it:

    no Workload / QuotaReserved=False ──▶ Queued (no pod; Kueue's message in the Admitted condition)
    Admitted=True ──▶ pods, with each role's assigned flavors' nodeLabels/tolerations and the admitted counts
    Evicted=True (e.g. Preempted) ──▶ pods go (the trainer gets SIGTERM and its grace period); once none is left
        the operator clears the admission (``release``), as Kueue's job integrations do; Kueue requeues it
    RLJob Succeeded/Failed ──▶ the Workload's Finished condition (``finish``): its quota frees

Growth (partial admission): Kueue's admitted counts are fixed, so a job admitted with fewer generators than it asks
for holds one more Workload per missing generator, ``<job>.generator-<ordinal>`` (one podSet, one generator; the
job's queue and priority; nodeSelector pinned to the flavors the job's generators were admitted on). Kueue admits
each when quota frees; the job then runs ``admitted count + grown`` generators (the surplus StatefulSet scales up,
the trainer follows the generator count without a restart). One evicted (preempted before the gang: Kueue takes the
most recently admitted of equal priority first) scales the generators down and gives its quota back once the
generator pods beyond the new count are gone; Kueue requeues it. They exist only while the job's own Workload is
admitted and the job is not over (``growth``).

Neighbours: ``reconcile`` reads the Workload, the ResourceFlavors and the WorkloadPriorityClass and writes what
this module returns; ``lifecycle`` treats a job that is not admitted like a suspended one. Invariant: nothing
here talks to the API server or reads a clock (``now`` is passed in).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from kubeforge.api import contract, rljob
from kubeforge.operator import reasons

API_VERSION = "kueue.x-k8s.io/v1beta2"        # the storage version of Kueue v0.17's CRDs
PRIORITY_GROUP = "kueue.x-k8s.io"
PRIORITY_KIND = "WorkloadPriorityClass"
# Kueue's Workload condition types and the reasons it writes that this module reads or writes
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
EVICTED_BY_PREEMPTION = "Preempted"
PENDING = "Pending"

Raw = Mapping[str, Any]


def queue_name(job: rljob.RLJob) -> str | None:
    """The LocalQueue the job asks for (None: not a Kueue workload)."""
    return (job.metadata.labels or {}).get(contract.LABEL_KUEUE_QUEUE) or None


def priority_class(job: rljob.RLJob) -> str | None:
    return (job.metadata.labels or {}).get(contract.LABEL_KUEUE_PRIORITY) or None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Assigned:
    """What Kueue assigned one podSet (role): its pod count and the flavors of its resources."""

    count: int
    flavors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkloadFacts:
    exists: bool = False
    admitted: bool = False
    evicted: tuple[str, str] | None = None          # (Kueue's reason, message) while Evicted is True
    finished: bool = False
    pending: str = ""                               # why quota is not reserved (QuotaReserved False's message)
    assigned: Mapping[str, Assigned] = dataclasses.field(default_factory=dict)
    resource_version: str = ""
    conditions: tuple[Mapping[str, Any], ...] = ()


def _cond(conds: list[Raw], kind: str) -> Raw | None:
    return next((c for c in conds if c.get("type") == kind), None)


def facts(raw: Raw | None) -> WorkloadFacts:
    """The facts of a raw Workload (None: it does not exist)."""
    if raw is None:
        return WorkloadFacts()
    st = raw.get("status") or {}
    conds = list(st.get("conditions") or [])
    admitted, evicted = _cond(conds, ADMITTED), _cond(conds, EVICTED)
    finished, reserved = _cond(conds, FINISHED), _cond(conds, QUOTA_RESERVED)
    admission = st.get("admission") or {}
    assigned = {a["name"]: Assigned(count=int(a.get("count") or 0),
                                    flavors=tuple(sorted(set((a.get("flavors") or {}).values()))))
                for a in admission.get("podSetAssignments") or [] if a.get("name")}
    return WorkloadFacts(
        exists=True, admitted=bool(admitted and admitted.get("status") == "True" and admission),
        evicted=(str(evicted.get("reason", "")), str(evicted.get("message", "")))
        if evicted and evicted.get("status") == "True" else None,
        finished=bool(finished and finished.get("status") == "True"),
        pending=str(reserved.get("message", "")) if reserved and reserved.get("status") == "False" else "",
        assigned=assigned, resource_version=str((raw.get("metadata") or {}).get("resourceVersion", "")),
        conditions=tuple(conds))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Gate:
    """May the job's pods exist, and what the RLJob's Admitted condition says."""

    admitted: bool
    reason: str
    message: str


def gate(wl: WorkloadFacts, *, invalid: str | None = None, grown: int = 0) -> Gate:
    """The gate of a queued job: ``invalid`` (a bad label: no such WorkloadPriorityClass) keeps it out for good;
    ``grown``: generators admitted since through grow Workloads."""
    if invalid:
        return Gate(admitted=False, reason=reasons.QUEUE_INVALID, message=invalid)
    if wl.evicted is not None:
        reason = reasons.PREEMPTED if wl.evicted[0] == EVICTED_BY_PREEMPTION else reasons.EVICTED
        return Gate(admitted=False, reason=reason, message=f"Kueue: {wl.evicted[1]}".strip())
    if wl.admitted:
        counts = ", ".join(f"{r} {a.count}" + (f" (+{grown} as quota freed)" if r == "generator" and grown else "")
                           for r, a in sorted(wl.assigned.items()))
        return Gate(admitted=True, reason=reasons.QUOTA_ADMITTED, message=f"admitted by Kueue: {counts}")
    why = wl.pending or ("waiting for Kueue to see its Workload" if wl.exists else "creating its Workload")
    return Gate(admitted=False, reason=reasons.QUEUED, message=f"Kueue: {why}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Flavor:
    """What a ResourceFlavor adds to the pods placed on it."""

    node_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


def flavor(raw: Raw) -> Flavor:
    spec = raw.get("spec") or {}
    return Flavor(node_labels=dict(spec.get("nodeLabels") or {}), tolerations=tuple(spec.get("tolerations") or ()))


def admitted_job(job: rljob.RLJob, wl: WorkloadFacts, flavors: Mapping[str, Flavor], *,
                 grown: int = 0) -> rljob.RLJob:
    """``job`` as Kueue admitted it: each role's assigned flavors' node labels join its nodeSelector and their
    tolerations its tolerations; the generators number what was admitted (partial admission: at least
    ``minReplicas``) plus ``grown`` (grow Workloads admitted since), never more than asked."""
    roles = job.spec.roles
    updates: dict[str, Any] = {}
    for role in contract.ROLES:
        got = wl.assigned.get(role)
        if got is None:
            continue
        spec = getattr(roles, role)
        selector, tolerations = dict(spec.node_selector), [dict(t) for t in spec.tolerations]
        for name in got.flavors:
            f = flavors.get(name, Flavor())
            selector.update(f.node_labels)
            tolerations += [dict(t) for t in f.tolerations if dict(t) not in tolerations]
        change: dict[str, Any] = {"node_selector": selector, "tolerations": tolerations}
        if role == "generator" and got.count:
            change["replicas"] = min(got.count + grown, spec.replicas)
        updates[role] = spec.model_copy(update=change)
    return job.model_copy(update={"spec": job.spec.model_copy(update={"roles": roles.model_copy(update=updates)})})


def admission_key(wl: WorkloadFacts, flavors: Mapping[str, Flavor], *, grown: int = 0) -> str:
    """A short digest of what was admitted (part of the render context: a new admission, or a generator grown or
    taken back, re-renders)."""
    doc: dict[str, Any] = {r: [a.count, list(a.flavors)] for r, a in sorted(wl.assigned.items())}
    doc["grown"] = grown
    doc["flavors"] = [[n, dict(f.node_labels), list(map(dict, f.tolerations))] for n, f in sorted(flavors.items())]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def _set(conds: list[dict[str, Any]], kind: str, status: str, reason: str, message: str, now: str,
         generation: int | None) -> None:
    old = next((c for c in conds if c.get("type") == kind), None)
    new = {"type": kind, "status": status, "reason": reason, "message": message[:1000],
           "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else now,
           **({"observedGeneration": generation} if generation is not None else {})}
    if old is None:
        conds.append(new)
    else:
        conds[conds.index(old)] = new


def release(wl: WorkloadFacts, *, now: str, generation: int | None = None) -> dict[str, Any] | None:
    """The status patch that gives an evicted Workload's quota back once the job has no pod left (what Kueue's
    job integrations do: QuotaReserved False ``Pending``, the admission cleared, Admitted False, Requeued True for a
    preemption); None when there is nothing to give back."""
    if wl.evicted is None or not wl.assigned:
        return None
    reason, message = wl.evicted
    conds = [dict(c) for c in wl.conditions]
    _set(conds, REQUEUED, "True" if reason == EVICTED_BY_PREEMPTION else "False", reason, message, now, generation)
    _set(conds, QUOTA_RESERVED, "False", PENDING, message, now, generation)
    _set(conds, ADMITTED, "False", "NoReservation", "The workload has no reservation", now, generation)
    return {"metadata": {"resourceVersion": wl.resource_version},
            "status": {"admission": None, "conditions": conds}}


def finish(wl: WorkloadFacts, *, succeeded: bool, message: str, now: str,
           generation: int | None = None) -> dict[str, Any] | None:
    """The status patch marking the Workload Finished (its quota frees); None when it is already."""
    if not wl.exists or wl.finished:
        return None
    conds = [dict(c) for c in wl.conditions]
    _set(conds, FINISHED, "True", "Succeeded" if succeeded else "Failed", message or "the RLJob finished", now,
         generation)
    return {"metadata": {"resourceVersion": wl.resource_version}, "status": {"conditions": conds}}


def grow_candidates(job: rljob.RLJob) -> range:
    """Generator ordinals that may have a grow Workload: those beyond the minimum Kueue may admit."""
    gen = job.spec.roles.generator
    return range(gen.gang_held(), gen.replicas)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Growth:
    """What this pass owes the grow Workloads (ordinal → Workload facts read; absent ones have ``exists`` False)."""

    grown: int                                    # grow Workloads admitted and not evicted: generators added
    create: tuple[int, ...] = ()                  # ordinals whose grow Workload is to exist (applied each pass)
    release: tuple[int, ...] = ()                 # evicted ones whose generator is gone: give the quota back
    delete: tuple[int, ...] = ()                  # not wanted (the job's Workload not admitted, or the job over)


def growth(job: rljob.RLJob, wl: WorkloadFacts, grows: Mapping[int, WorkloadFacts], *, over: bool,
           live_generators: tuple[int, ...]) -> Growth:
    """The grow Workloads' plan. ``live_generators``: indexes of the job's generator pods not terminating. A grow
    Workload's quota is given back (released when evicted, deleted when not wanted) only once no generator beyond the
    new count is alive, so the quota never serves two pods at once."""
    got = wl.assigned.get("generator")
    base = got.count if wl.admitted and wl.evicted is None and got is not None and not over else None
    wanted = range(base, job.spec.roles.generator.replicas) if base is not None else range(0)
    grown = sum(1 for i in wanted if grows.get(i, WorkloadFacts()).admitted and grows[i].evicted is None)
    target = base + grown if base is not None else 0
    drained = all(i < target for i in live_generators)
    release = tuple(i for i in wanted if grows.get(i, WorkloadFacts()).evicted is not None and drained)
    delete = tuple(i for i, f in sorted(grows.items()) if f.exists and i not in wanted and (drained or over))
    return Growth(grown=grown, create=tuple(wanted), release=release, delete=delete)
