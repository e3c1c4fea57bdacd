"""Observed facts: the few things the operator needs from its children's raw API objects, typed and frozen.

Role: the boundary between the API's JSON and the pure decision code (``lifecycle``, ``status``). Parsing is
tolerant — a malformed progress annotation or a pod without labels yields "unknown", never an exception — because
the cluster, not the operator, owns these objects. Neighbours: ``apply`` lists the raw pods; ``router`` also
hands over pods it saw fail in watch events (a Failed pod can be replaced before the next list sees it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from kubeforge.api import contract, progress
from kubeforge.operator import names

Raw = Mapping[str, Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Failure:
    """A container (or pod) failure of one pod of one attempt."""

    role: str
    pod: str
    attempt: int | None
    exit_code: int | None
    reason: str
    time: str | None
    key: str = ""          # identifies this failure of this pod (container ID, else pod UID + restart count)
    node: str | None = None   # the node, for a pod the operator judged lost with it (``nodeloss``)
    since: str | None = None  # when the fault itself happened, when known better than ``time`` (a lost node's
                              # last heartbeat): the start of the recovery's breakdown (``recovery``)

    @property
    def ident(self) -> str:
        """What ``status.handledFailures`` remembers, so one failure is never acted on twice."""
        return self.key or f"{self.pod}/{self.exit_code}/{self.reason}/{self.time}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodFacts:
    """One pod of the job."""

    name: str
    role: str
    index: int | None
    attempt: int | None
    world: str | None
    phase: str
    scheduled: bool
    ready: bool
    terminating: bool
    restarts: int
    unschedulable: str | None        # the scheduler's message while the pod cannot be placed
    failure: Failure | None
    progress: progress.ProgressReport | None
    stuck: tuple[str, str] | None = None   # (reason, message) of a container that cannot start (STUCK_REASONS)
    export_request: str | None = None      # the pod's contract.ANNOTATION_EXPORT_REQUEST (the operator's relay)
    node: str | None = None                # spec.nodeName
    uid: str = ""                          # metadata.uid (the precondition of a forced delete)
    trainer_epoch: int | None = None       # the pod's contract.LABEL_TRAINER_EPOCH (trainers; None: absent)
    marks: PodMarks | None = None          # when it was created, scheduled, running, ready (``recovery``)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodMarks:
    """The times (RFC 3339, as the API server wrote them) a pod reached each stage of its start; None: not yet."""

    created: str | None = None       # metadata.creationTimestamp
    scheduled: str | None = None     # the PodScheduled condition's lastTransitionTime, once True
    running: str | None = None       # the latest container's state.running.startedAt (a restart in place too)
    ready: str | None = None         # the Ready condition's lastTransitionTime, once True


# Waiting reasons of a container that will not start by waiting: the kubelet retries them silently forever.
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerError",
                 "CreateContainerConfigError", "RunContainerError")


def _stuck(st: Raw) -> tuple[str, str] | None:
    for cs in (st.get("initContainerStatuses") or []) + (st.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            return waiting["reason"], f"container {cs.get('name', '?')}: {waiting.get('message', '')}".strip()
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observed:
    """Everything a reconcile pass saw: the job's pods plus failures reported by watch events."""

    pods: tuple[PodFacts, ...] = ()
    seen_failures: tuple[Failure, ...] = ()

    def of_attempt(self, attempt: int) -> list[PodFacts]:
        return [p for p in self.pods if p.attempt == attempt]

    def stale(self, attempt: int) -> list[PodFacts]:
        """Pods that belong to another attempt (they must be gone before the next attempt starts)."""
        return [p for p in self.pods if p.attempt != attempt]


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# Pod-level ends and the failure-policy reason they match (kubeforge.api.rljob.FailureReason).
# A preemption (the scheduler's for a pod of higher priority: DisruptionTarget reason PreemptionByScheduler; the
# kubelet's for a critical pod: phase Failed, reason Preempting) reads as Preempted before any container's exit
# (the SIGTERM it sends ends the trainer with 143): one failure per pod, keyed by the pod, acted on once.
_DISRUPTION_REASONS = {"DeletionByTaintManager": "NodeLost", "EvictionByEvictionAPI": "Evicted",
                       "TerminationByKubelet": "Evicted", "NodeLost": "NodeLost", "Evicted": "Evicted"}
PREEMPTION_REASONS = ("PreemptionByScheduler", "Preempting")


def _terminated_failure(term: Raw, *, role: str, pod: str, attempt: int | None, key: str) -> Failure | None:
    code = _int(term.get("exitCode"))
    if code == 0:
        return None
    return Failure(role=role, pod=pod, attempt=attempt, exit_code=code, reason=str(term.get("reason") or "Error"),
                   time=term.get("finishedAt"), key=str(term.get("containerID") or key))


def pod_failure(pod: Raw) -> Failure | None:
    """The newest failure a pod shows: a container terminated non-zero now or before its last restart, a Failed
    pod (Evicted), or a pod the node lost (its DisruptionTarget condition)."""
    md, st = pod.get("metadata", {}), pod.get("status", {}) or {}
    labels = md.get("labels", {}) or {}
    role, name, attempt = labels.get(contract.LABEL_ROLE, ""), md.get("name", ""), _int(labels.get(contract.LABEL_ATTEMPT))
    uid = md.get("uid") or name
    disrupted = _condition(st, "DisruptionTarget")
    if ((disrupted.get("status") == "True" and disrupted.get("reason") in PREEMPTION_REASONS
         and md.get("deletionTimestamp")) or (st.get("phase") == "Failed" and st.get("reason") in PREEMPTION_REASONS)):
        return Failure(role=role, pod=name, attempt=attempt, exit_code=None, reason="Preempted", time=None,
                       key=f"{uid}/pod")
    statuses = st.get("containerStatuses") or []
    for cs in statuses:
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            term = state.get("terminated")
            if term:   # the same end reads alike as ``state`` and, after the restart, as ``lastState``
                key = f"{uid}/{cs.get('name')}/{term.get('startedAt')}/{term.get('finishedAt')}"
                found = _terminated_failure(term, role=role, pod=name, attempt=attempt, key=key)
                if found:
                    return found
    if st.get("phase") == "Failed" or (disrupted.get("status") == "True" and md.get("deletionTimestamp")):
        raw = str(st.get("reason") or disrupted.get("reason") or "Failed")
        return Failure(role=role, pod=name, attempt=attempt, exit_code=None,
                       reason=_DISRUPTION_REASONS.get(raw, raw), time=None, key=f"{uid}/pod")
    return None


def _condition(st: Raw, kind: str) -> Raw:
    for c in st.get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def pod_marks(md: Raw, st: Raw) -> PodMarks:
    sched, ready = _condition(st, "PodScheduled"), _condition(st, "Ready")
    running = [str(t) for cs in st.get("containerStatuses") or []
               if (t := ((cs.get("state") or {}).get("running") or {}).get("startedAt"))]
    return PodMarks(created=md.get("creationTimestamp"),
                    scheduled=sched.get("lastTransitionTime") if sched.get("status") == "True" else None,
                    running=max(running) if running else None,
                    ready=ready.get("lastTransitionTime") if ready.get("status") == "True" else None)


def pod_facts(pod: Raw) -> PodFacts:
    """Typed facts of one raw pod."""
    md, spec, st = pod.get("metadata", {}), pod.get("spec", {}) or {}, pod.get("status", {}) or {}
    labels, ann = md.get("labels", {}) or {}, md.get("annotations", {}) or {}
    sched = _condition(st, "PodScheduled")
    unsched = sched.get("message") or "unschedulable" if (
        sched.get("status") == "False" and sched.get("reason") == "Unschedulable") else None
    return PodFacts(
        name=md.get("name", ""), role=labels.get(contract.LABEL_ROLE, ""),
        index=_int(labels.get(names.LABEL_POD_INDEX)), attempt=_int(labels.get(contract.LABEL_ATTEMPT)),
        world=ann.get(names.ANNOTATION_WORLD), phase=st.get("phase", "Pending"),
        scheduled=bool(spec.get("nodeName")), ready=_condition(st, "Ready").get("status") == "True",
        terminating=md.get("deletionTimestamp") is not None,
        restarts=sum(int(cs.get("restartCount", 0)) for cs in st.get("containerStatuses") or []),
        unschedulable=unsched, failure=pod_failure(pod),
        progress=progress.ProgressReport.decode(ann.get(contract.ANNOTATION_PROGRESS)), stuck=_stuck(st),
        export_request=ann.get(contract.ANNOTATION_EXPORT_REQUEST),
        node=spec.get("nodeName") or None, uid=str(md.get("uid") or ""),
        trainer_epoch=_int(labels.get(contract.LABEL_TRAINER_EPOCH)), marks=pod_marks(md, st),
    )


def observe(pods: Iterable[Raw], seen_failures: Iterable[Failure] = ()) -> Observed:
    """Observed facts from raw pods (sorted by name, so decisions never depend on list order)."""
    return observe_facts((pod_facts(p) for p in pods), seen_failures)


def observe_facts(facts: Iterable[PodFacts], seen_failures: Iterable[Failure] = ()) -> Observed:
    """Observed facts from already typed pods (the watch cache's), sorted by name."""
    # agent pods (spec.agent) are not the job's roles: their end costs episodes (agent_lost), never a restart; nor
    # are sandbox pods (spec.sandbox: they lack the job label, so a watch by it never sees them; kept out here too)
    kept = (f for f in facts if f.role not in (contract.AGENT, contract.SANDBOX))
    return Observed(pods=tuple(sorted(kept, key=lambda p: p.name)), seen_failures=tuple(seen_failures))
