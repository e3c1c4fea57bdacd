"""Peer silence: the job's own heartbeats find a lost pod before the node controller does; pure decisions.

Trainer rank 0 hears every generator beat (``generator.join.AliveBeats``, every ``peerSilenceSeconds / 4``) and
reports those silent for ``peerSilenceSeconds`` in its progress annotation (``silentGenerators``: index -> wall
clock last heard; docs/recovery.md). The node controller needs ``node-monitor-grace-period`` (40 s) and the
operator's node-loss grace on top (``nodeloss``) before a lost node's pods are failed. Here the operator acts on
the report at once when the silent generator's node does not answer either:

```
 report: generator g silent since t ──▶ its pod (running since <= t, unfinished, on node n)
   n not Ready, or its kubelet's last word w (Lease renewTime, Ready heartbeat) <= t + a beat,
   and w + one Lease renewal (+ margin) has passed ──▶ n is lost: every pod of the job on n (NodeLost)
   n answers, g silent for 2 x peerSilenceSeconds ──▶ g's pod alone (Unhealthy)
```

Neighbours: ``reconcile`` reads the Node and its Lease (``kube-node-lease``) of each silent generator's pod, merges
this verdict with ``nodeloss.judge``'s (same failure identity ``<uid>/NodeLost``: a pod is never counted twice),
and force-deletes the lost pods once their StatefulSets have observed the template that keeps replacements off a
node that does not answer (:func:`avoided`).

Invariants:
- Only the current trainer's report counts (``fencing.screen`` already dropped a stale epoch's); a pod started
  after the generator was last heard (a restart, a replacement) is a new start, never judged by this silence.
- Without a readable Lease the kubelet's cadence is unknown (the Ready heartbeat is posted every 5 min on a quiet
  node by default), so its heartbeat alone never says "not answering": only a not-Ready node does.
- Acting early is safe because fencing refuses a stale trainer's writes (docs/fencing.md) and a stale generator's
  rollouts carry an older policy version; a wrong guess (a node that was only slow) costs one restart.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from kubeforge.api import progress, rljob
from kubeforge.operator import nodeloss, observed, timefmt

#: The reason of a silent generator's pod on a node that still answers.
UNHEALTHY = rljob.FailureReason.UNHEALTHY.value
#: The kubelet renews its Lease every quarter of the Lease's duration (kubelet: ``renewInterval``).
RENEW_FRACTION = 0.25
#: Slack on the kubelet's last word: the API server's whole-second times and a renewal late under load.
WORD_SLACK_S = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Kubelet:
    """What the operator reads of a node's kubelet besides the Node: its Lease (None: absent or not readable)."""

    renewed: dt.datetime | None          # spec.renewTime
    duration: float | None               # spec.leaseDurationSeconds

    @property
    def cadence(self) -> float | None:
        """Seconds between two renewals of a live kubelet."""
        return self.duration * RENEW_FRACTION if self.duration else None


def kubelet(raw: Mapping[str, Any] | None) -> Kubelet | None:
    """Typed facts of a raw Lease of ``kube-node-lease`` (None: no Lease read)."""
    if raw is None:
        return None
    spec = raw.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    return Kubelet(renewed=timefmt.parse(spec.get("renewTime")),
                   duration=float(duration) if isinstance(duration, (int, float)) and duration > 0 else None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Silent:
    """A generator pod trainer 0 reports silent since ``since``."""

    pod: observed.PodFacts
    since: dt.datetime


def silent_pods(report: progress.ProgressReport | None, pods: Iterable[observed.PodFacts]) -> list[Silent]:
    """The pods of the generators ``report`` names silent that were running before they went silent, scheduled and
    unfinished (a pod started afterwards is a new start: no judgment of this silence)."""
    if report is None or not report.silent_generators:
        return []
    out: list[Silent] = []
    for p in sorted(pods, key=lambda q: q.name):
        last = report.silent_generators.get(p.index) if p.role == "generator" and p.index is not None else None
        if last is None or not p.node or p.terminating or p.phase in ("Succeeded", "Failed"):
            continue
        since = dt.datetime.fromtimestamp(last, dt.timezone.utc)
        started = timefmt.parse(p.marks.running) if p.marks is not None else None
        if started is None or started > since:
            continue
        out.append(Silent(pod=p, since=since))
    return out


def word(node: nodeloss.NodeFacts, lease: Kubelet | None) -> dt.datetime | None:
    """The kubelet's last word: the newer of its Lease's renewal and its Ready heartbeat."""
    marks = [t for t in (node.heartbeat, lease.renewed if lease is not None else None) if t is not None]
    return max(marks) if marks else None


def quiet_after(node: nodeloss.NodeFacts, lease: Kubelet | None, *, since: dt.datetime,
                beat: float) -> dt.datetime | None:
    """When node ``node`` counts as not answering for a generator silent since ``since`` (None: not by this
    silence; a time at or before now: it does not answer now). Not Ready: at once. Otherwise the kubelet must
    have said nothing since the generator's last beat (``beat`` seconds of slack: the beat that did not come) and
    the renewal a live kubelet makes one cadence after its last word must be overdue, with a margin. Counted from
    that word, not from the beat: a kubelet that died with its pods renewed up to a cadence before them, and
    waiting a whole cadence past the beat cost 1-7.5 s more at the defaults (docs/recovery.md)."""
    if node.ready != "True":
        return since
    cadence = lease.cadence if lease is not None else None
    last = word(node, lease)
    if cadence is None or last is None:
        return None
    if last > since + dt.timedelta(seconds=beat + WORD_SLACK_S):
        return None
    return last + dt.timedelta(seconds=cadence + max(2.0, cadence / 4))


def judge(silent: Iterable[Silent], pods: Iterable[observed.PodFacts], nodes: Mapping[str, nodeloss.NodeFacts],
          leases: Mapping[str, Kubelet | None], *, now: dt.datetime, peer_silence: float) -> nodeloss.Verdict:
    """The pods lost by the silence of generators (see the module docstring), and when to look again."""
    pods = sorted(pods, key=lambda q: q.name)
    gone_nodes: dict[str, dt.datetime | None] = {}
    alone: list[Silent] = []
    wait: float | None = None

    def later(at: dt.datetime) -> None:
        nonlocal wait
        left = max(0.5, (at - now).total_seconds())
        wait = left if wait is None else min(wait, left)

    for s in silent:
        n = nodes.get(s.pod.node or "")
        if n is None:
            continue
        due = quiet_after(n, leases.get(n.name), since=s.since, beat=peer_silence / 4)
        if due is not None and due <= now:
            gone_nodes.setdefault(n.name, word(n, leases.get(n.name)))   # the fault mark: the kubelet's last word
            continue
        if due is not None:
            later(due)
        own = s.since + dt.timedelta(seconds=2 * peer_silence)
        if own <= now:
            alone.append(s)
        else:
            later(own)
    lost: list[nodeloss.LostPod] = []
    for p in pods:
        if p.node in gone_nodes and p.phase not in ("Succeeded", "Failed"):
            lost.append(lost_pod(p, node=p.node, reason=nodeloss.REASON, now=now, since=gone_nodes[p.node]))
    for s in alone:
        if s.pod.node not in gone_nodes:
            lost.append(lost_pod(s.pod, node=s.pod.node or "", reason=UNHEALTHY, now=now, since=s.since))
    return nodeloss.Verdict(lost=tuple(lost), requeue_after=wait)


def lost_pod(p: observed.PodFacts, *, node: str, reason: str, now: dt.datetime,
             since: dt.datetime | None) -> nodeloss.LostPod:
    """``p`` failed with ``reason`` on ``node`` now, with the node-loss path's identity (``<uid>/NodeLost``), its
    fault mark ``since`` (the kubelet's last word, for ``recovery``)."""
    uid = p.uid or p.name
    return nodeloss.LostPod(pod=p.name, uid=p.uid, node=node, failure=observed.Failure(
        role=p.role, pod=p.name, attempt=p.attempt, exit_code=None, reason=reason, time=timefmt.fmt(now),
        key=f"{uid}/{nodeloss.REASON}", node=node, since=timefmt.fmt(since) if since is not None else None))


def avoided(last: rljob.FailureInfo | None, node: nodeloss.NodeFacts | None, lease: Kubelet | None) -> tuple[str, ...]:
    """The nodes the job's new pods must keep off: the node of the last failure (NodeLost) while its kubelet has
    said nothing since that failure was acted on (the scheduler still places pods there until the node controller
    marks it not Ready, 40 s after its last heartbeat by default). Lifted once the kubelet speaks again."""
    if last is None or last.reason != nodeloss.REASON or not last.node or node is None:
        return ()
    acted = timefmt.parse(last.time)
    spoke = word(node, lease)
    if acted is None or (spoke is not None and spoke > acted and node.ready == "True"):
        return ()
    return (last.node,)


def left_on(avoid: Iterable[str], pods: Iterable[observed.PodFacts], *, taken: set[str],
            now: dt.datetime) -> tuple[nodeloss.LostPod, ...]:
    """The job's unfinished pods still on a node it avoids (found not answering in an earlier pass, silent since):
    lost with it (their failure was counted when the node was found: the same identity is not counted again),
    so their forced delete does not depend on trainer 0's report, which goes with its pod in a new attempt."""
    nodes = set(avoid)
    return tuple(lost_pod(p, node=p.node or "", reason=nodeloss.REASON, now=now, since=None)
                 for p in sorted(pods, key=lambda q: q.name)
                 if p.node in nodes and p.name not in taken and p.phase not in ("Succeeded", "Failed"))


def message(verdict: nodeloss.Verdict, node: str, peer_silence: float) -> str:
    """The event's message for a node found not answering by a generator's silence."""
    return (f"node {node} does not answer and trainer 0 has not heard its generator for {peer_silence:g}s or more "
            f"(spec.failurePolicy.peerSilenceSeconds): force-deleting the job's pods on it "
            f"({', '.join(verdict.pods_on(node))}) so they are re-created on a node that works")


def left_message(verdict: nodeloss.Verdict, node: str) -> str:
    """The event's message for pods still on a node found lost in an earlier pass (its kubelet silent since)."""
    return (f"node {node} has not answered since the job's pods on it were failed: force-deleting the ones still "
            f"there ({', '.join(verdict.pods_on(node))})")
