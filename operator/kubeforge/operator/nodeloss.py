"""Node loss: a node that stopped reporting holds the job's pods for ever (docs/node-loss.md); pure decisions.

A StatefulSet pod on a node whose kubelet is gone stays Running (or Terminating once deleted) until something
confirms its containers stopped, and the StatefulSet controller never makes a second pod of the same identity, so
the job stalls. The operator decides here, from facts alone, which of the job's pods are lost:

- suspects: the nodes of the job's scheduled pods that are not ready (a Ready pod's node posted status lately, so
  a pass reads no Node while every pod is ready: steady state costs nothing);
- lost: a pod whose node has had Ready != True (False or Unknown) for ``grace`` seconds or more; before that the
  pass asks to run again when the grace ends;
- handled (``reconcile``): each lost pod counts as a failure of its role with reason ``NodeLost`` (the failure
  policy's rules match it; RestartAll by default: a new attempt on the surviving nodes, the trainer resumes from its
  last complete checkpoint), and is then force-deleted (grace period 0, UID precondition) so the StatefulSet
  controller can re-create it elsewhere.

Fencing risk: a node that is only partitioned (not dead) still runs the pods that were force-deleted; for a while
two pods of one identity can run. The grace bounds false positives of a slow kubelet, not this risk; the
checkpoint commit being atomic per step (a rename) keeps a stale writer from leaving a torn checkpoint, but not from
committing one: docs/node-loss.md.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from kubeforge.operator import observed, timefmt

#: Seconds a node may be not Ready before the job's pods on it count as lost (``--node-loss-grace-seconds``).
GRACE_S = 60.0
GRACE_MIN_S, GRACE_MAX_S = 10.0, 3600.0
#: The failure reason a lost pod reports (``kubeforge.api.rljob.FailureReason.NODE_LOST``).
REASON = "NodeLost"


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeFacts:
    """What the operator reads of a Node: its name, its Ready condition's status and since when."""

    name: str
    ready: str                     # "True", "False", "Unknown" ("Unknown" too when the Node has no such condition)
    since: dt.datetime | None      # the Ready condition's lastTransitionTime
    heartbeat: dt.datetime | None = None   # the Ready condition's lastHeartbeatTime: the kubelet's last word


def node_facts(raw: Mapping[str, Any] | None, name: str) -> NodeFacts:
    """Typed facts of a raw Node; an absent Node (None: deleted) reads as not Ready since an unknown time."""
    if raw is None:
        return NodeFacts(name=name, ready="Unknown", since=None)
    for c in (raw.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return NodeFacts(name=name, ready=str(c.get("status") or "Unknown"),
                             since=timefmt.parse(c.get("lastTransitionTime")),
                             heartbeat=timefmt.parse(c.get("lastHeartbeatTime")))
    return NodeFacts(name=name, ready="Unknown", since=None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LostPod:
    pod: str
    uid: str
    node: str
    failure: observed.Failure


@dataclasses.dataclass(frozen=True, kw_only=True)
class Verdict:
    """The lost pods (fail and force-delete them), and when to look again for nodes still in their grace."""

    lost: tuple[LostPod, ...] = ()
    requeue_after: float | None = None

    @property
    def nodes(self) -> list[str]:
        return sorted({p.node for p in self.lost})

    def pods_on(self, node: str) -> list[str]:
        return sorted(p.pod for p in self.lost if p.node == node)


def suspects(pods: Iterable[observed.PodFacts]) -> list[str]:
    """Nodes worth reading: those of scheduled, not ready, unfinished pods."""
    return sorted({p.node for p in pods if p.node and not p.ready and p.phase not in ("Succeeded", "Failed")})


def clamp_grace(seconds: float) -> float:
    return min(GRACE_MAX_S, max(GRACE_MIN_S, seconds))


def judge(pods: Iterable[observed.PodFacts], nodes: Mapping[str, NodeFacts], *, now: dt.datetime,
          grace: float = GRACE_S) -> Verdict:
    """Which pods are lost now, and when a node not Ready yet within its grace must be looked at again. A node
    not Ready since an unknown time (no transition time, or no Node) counts from ``now``: it is never lost in the
    pass that first sees it."""
    lost: list[LostPod] = []
    wait: float | None = None
    for p in sorted(pods, key=lambda q: q.name):
        n = nodes.get(p.node or "")
        if n is None or n.ready == "True" or p.phase in ("Succeeded", "Failed"):
            continue
        since = n.since or now
        left = grace - (now - since).total_seconds()
        if left > 0:
            wait = left if wait is None else min(wait, left)
            continue
        uid = p.uid or p.name
        lost.append(LostPod(pod=p.name, uid=p.uid, node=n.name, failure=observed.Failure(
            role=p.role, pod=p.name, attempt=p.attempt, exit_code=None, reason=REASON,
            time=timefmt.fmt(now), key=f"{uid}/{REASON}", node=n.name,
            since=timefmt.fmt(n.heartbeat) if n.heartbeat is not None else None)))
    return Verdict(lost=tuple(lost), requeue_after=wait)


def message(verdict: Verdict, node: str, grace: float) -> str:
    """The event's message: the node, for how long it was silent at least, and the pods force-deleted."""
    return (f"node {node} not Ready for {grace:.0f}s or more: force-deleting the job's pods on it "
            f"({', '.join(verdict.pods_on(node))}) so they are re-created on a node that works")
