"""Trainer silence: a lost trainer's node found by the job's own evidence, before the node controller; pure.

Generators beat to trainer 0, which reports the silent ones (``peersilence``). Nobody hears a trainer that way: a
trainer on a node that died or was cut off simply stops reporting steps, and until now the job waited for the node
controller's ``node-monitor-grace-period`` (40 s in ``make e2e-nodes``, 3m20s in kwokctl's clusters) plus the
operator's node-loss grace (``nodeloss``). Here the operator puts three facts together (docs/recovery.md):

```
 trainer 0 reported a step of this attempt at q, nothing since for peerSilenceSeconds (the job's own evidence)
   and a node n holding a trainer pod of the attempt:
     not Ready ──────────────────────────────────────────────────────────────────────▶ n is lost
     its kubelet's last word w (Lease renewTime, Ready heartbeat), q <= due = w + one renewal (+ margin) <= now,
     and a witness: another node of the job whose kubelet renewed at or after w + one renewal ──▶ n is lost
 n is lost ──▶ every unfinished pod of the job on n: NodeLost (the node-loss failure's identity)
```

Why each fact: a step time alone proves nothing (a step may take minutes); a lapsed Lease alone may be a slow API
server on a loaded machine (kwok's leases lapsed so at 1,000 nodes), which delays every kubelet's renewal alike,
so another kubelet's renewal made when the suspect's was due says the API server took renewals then; a step reported
after ``due`` says the suspect node's processes still reached the API server after its kubelet went quiet, so the
node is not judged by this rule. Before trainer 0's first step of an attempt there is no progress to go quiet:
the node controller decides, as before.

Neighbours: ``reconcile`` reads the Node and Lease of each trainer pod's node once progress has been quiet for
``peerSilenceSeconds`` (:func:`watched`), the Leases of the job's other nodes only when a trainer node is overdue
(:func:`overdue`), merges :func:`judge`'s verdict with ``nodeloss``'s and ``peersilence``'s (one failure identity,
``<uid>/NodeLost``: a pod is failed once whichever path sees it first), and force-deletes the lost pods once
their StatefulSets observed the templates that keep replacements off the node (``peersilence.avoided``) and,
for a trainer, carry the raised epoch (``fencing.template_observed``).

Invariants: acting early is safe because fencing refuses every write of the old trainer's epoch
(docs/fencing.md); a wrong guess (a trainer in a long step on a node whose kubelet alone stopped renewing while
another kubelet renewed) costs one restart, counted as any. Without a readable Lease only a not-Ready node counts.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping

from kubeforge.api import progress
from kubeforge.operator import nodeloss, observed, peersilence

#: The shortest wait before looking again at an overdue node without a witness yet.
RECHECK_MIN_S = 1.0


def quiet_since(report: progress.ProgressReport | None, *, last_progress: dt.datetime | None) -> dt.datetime | None:
    """When the job's trainers last made progress: trainer 0's report of a step of this attempt (the report's own
    wall clock; the status's ``lastProgressTime`` for a trainer that reports none). None: no step reported in this
    attempt, so there is no progress to go quiet."""
    if report is None or report.step <= 0:
        return None
    if report.time > 0:
        return dt.datetime.fromtimestamp(report.time, dt.timezone.utc)
    return last_progress


def trainer_pods(pods: Iterable[observed.PodFacts], *, attempt: int) -> list[observed.PodFacts]:
    """The attempt's trainer pods whose node may be judged: scheduled, unfinished, not being deleted."""
    return sorted((p for p in pods if p.role == "trainer" and p.attempt == attempt and p.node and not p.terminating
                   and p.phase not in ("Succeeded", "Failed")), key=lambda p: p.name)


def watched(trainers: Iterable[observed.PodFacts], *, quiet: dt.datetime | None, now: dt.datetime,
            peer_silence: float) -> tuple[list[str], float | None]:
    """The trainer nodes to read now (progress quiet for ``peer_silence``), or none and the seconds until they are
    worth reading (None: nothing to watch)."""
    nodes = sorted({p.node for p in trainers if p.node})
    if quiet is None or not nodes:
        return [], None
    left = (quiet - now).total_seconds() + peer_silence
    return (nodes, None) if left <= 0 else ([], max(RECHECK_MIN_S, left))


def due(node: nodeloss.NodeFacts, lease: peersilence.Kubelet | None, *, quiet: dt.datetime) -> dt.datetime | None:
    """When ``node`` counts as not answering for progress quiet since ``quiet`` (None: not by this rule). Not
    Ready: at once. Otherwise one renewal and its margin after its kubelet's last word (``peersilence``'s rule),
    provided the trainers' last progress came no later (progress after it: the node's processes answered then)."""
    if node.ready != "True":
        return quiet
    cadence = lease.cadence if lease is not None else None
    last = peersilence.word(node, lease)
    if cadence is None or last is None:
        return None
    at = last + dt.timedelta(seconds=cadence + max(2.0, cadence / 4))
    return at if quiet <= at else None


def overdue(nodes: Mapping[str, nodeloss.NodeFacts], leases: Mapping[str, peersilence.Kubelet | None], *,
            quiet: dt.datetime, now: dt.datetime) -> list[str]:
    """The Ready trainer nodes whose renewal is overdue now: they need a witness (read the job's other nodes)."""
    out = []
    for name, n in sorted(nodes.items()):
        at = due(n, leases.get(name), quiet=quiet)
        if n.ready == "True" and at is not None and at <= now:
            out.append(name)
    return out


def witnessed(at: dt.datetime, *, suspect: str, witnesses: Mapping[str, peersilence.Kubelet | None]) -> str | None:
    """Another node whose kubelet renewed at or after ``at``, when the suspect's own renewal was due (the API server
    took renewals then), or None."""
    for name, k in sorted(witnesses.items()):
        if name != suspect and k is not None and k.renewed is not None and k.renewed >= at:
            return name
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Judged:
    """The pods lost with their trainer's node and when to look again (``verdict``), each lost node's witness
    (None: not Ready), and for how long progress had been quiet (for the event's message)."""

    verdict: nodeloss.Verdict
    witnesses: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    quiet_s: float = 0.0


def judge(pods: Iterable[observed.PodFacts], trainers: Iterable[observed.PodFacts], *, quiet: dt.datetime,
          nodes: Mapping[str, nodeloss.NodeFacts], leases: Mapping[str, peersilence.Kubelet | None],
          witnesses: Mapping[str, peersilence.Kubelet | None], now: dt.datetime) -> Judged:
    """The job's pods lost by its trainers' silence (module docstring). ``nodes``/``leases``: the trainer nodes';
    ``witnesses``: the Leases of the job's other nodes (read only when a trainer node is overdue)."""
    gone: dict[str, tuple[dt.datetime | None, str | None]] = {}
    wait: float | None = None
    for name in sorted({p.node for p in trainers if p.node}):
        n = nodes.get(name)
        if n is None:
            continue
        lease = leases.get(name)
        at = due(n, lease, quiet=quiet)
        if at is None:
            continue
        left = (at - now).total_seconds()
        if left > 0:
            wait = left if wait is None else min(wait, left)
            continue
        if n.ready != "True":
            gone[name] = (peersilence.word(n, lease), None)
            continue
        last = peersilence.word(n, lease)
        cadence = lease.cadence if lease is not None else None
        witness = witnessed(last + dt.timedelta(seconds=cadence), suspect=name, witnesses=witnesses) \
            if last is not None and cadence else None
        if witness is None:      # every kubelet quiet alike: the API server, not the node; look again soon
            again = max(RECHECK_MIN_S, (cadence or 4 * RECHECK_MIN_S) / 4)
            wait = again if wait is None else min(wait, again)
            continue
        gone[name] = (peersilence.word(n, lease), witness)
    lost = tuple(peersilence.lost_pod(p, node=p.node or "", reason=nodeloss.REASON, now=now, since=gone[p.node][0])
                 for p in sorted(pods, key=lambda q: q.name)
                 if p.node in gone and p.phase not in ("Succeeded", "Failed"))
    return Judged(verdict=nodeloss.Verdict(lost=lost, requeue_after=wait),
                  witnesses={name: w for name, (_, w) in gone.items()})


def message(verdict: nodeloss.Verdict, node: str, *, witness: str | None, quiet_s: float) -> str:
    """The event's message for a trainer's node found not answering by the job's own evidence."""
    why = (f"its kubelet's Lease lapsed (node {witness}'s kubelet renewed since)" if witness is not None
           else "it is not Ready")
    return (f"node {node} holds a trainer and does not answer: the trainers have reported no step for "
            f"{quiet_s:.0f}s (spec.failurePolicy.peerSilenceSeconds) and {why}: force-deleting the job's pods on it "
            f"({', '.join(verdict.pods_on(node))}) so they are re-created on a node that works")

