"""Node loss (docs/node-loss.md): which pods are lost with their node, and what one reconcile pass does with them."""
from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import opbuilders
from kubeforge.api import contract, load
from kubeforge.operator import nodeloss, observed, reasons, reconcile, timefmt

T0 = opbuilders.T0
GRACE = 60.0


def node(name: str, ready: str, since: dt.datetime | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {"type": "Ready", "status": ready}
    if since is not None:
        cond["lastTransitionTime"] = timefmt.fmt(since)
    return {"metadata": {"name": name}, "status": {"conditions": [cond]}}


def facts(raw: dict[str, Any], uid: str = "") -> observed.PodFacts:
    if uid:
        raw["metadata"]["uid"] = uid
    return observed.pod_facts(raw)


def test_node_facts_read_the_ready_condition() -> None:
    assert nodeloss.node_facts(node("a", "True", T0), "a") == nodeloss.NodeFacts(name="a", ready="True", since=T0)
    assert nodeloss.node_facts(node("a", "Unknown", T0), "a").ready == "Unknown"
    assert nodeloss.node_facts(None, "gone") == nodeloss.NodeFacts(name="gone", ready="Unknown", since=None)
    assert nodeloss.node_facts({"status": {"conditions": []}}, "x").ready == "Unknown"


def test_pods_know_their_node_and_uid() -> None:
    p = facts(opbuilders.pod("tiny", "trainer", 0, node="n1"), uid="u-7")
    assert (p.node, p.uid) == ("n1", "u-7")
    assert facts(opbuilders.pod("tiny", "trainer", 0, node=None)).node is None


def test_only_nodes_of_not_ready_unfinished_pods_are_read() -> None:
    pods = [facts(opbuilders.pod("tiny", "trainer", 0, node="n0")),                        # ready
            facts(opbuilders.pod("tiny", "generator", 0, node="n1", ready=False)),
            facts(opbuilders.pod("tiny", "verifier", 0, node="n2", ready=False, phase="Succeeded")),
            facts(opbuilders.pod("tiny", "reward", 0, node=None, ready=False))]             # not scheduled
    assert nodeloss.suspects(pods) == ["n1"]


def test_a_node_within_its_grace_is_looked_at_again_when_it_ends() -> None:
    pods = [facts(opbuilders.pod("tiny", "generator", 0, node="n1", ready=False))]
    nodes = {"n1": nodeloss.node_facts(node("n1", "Unknown", T0), "n1")}
    v = nodeloss.judge(pods, nodes, now=T0 + dt.timedelta(seconds=45), grace=GRACE)
    assert v.lost == () and v.requeue_after == 15.0


def test_a_node_past_its_grace_loses_its_pods_and_only_those() -> None:
    pods = [facts(opbuilders.pod("tiny", "generator", 0, node="n1", ready=False), uid="u-g"),
            facts(opbuilders.pod("tiny", "trainer", 0, node="n0", ready=False), uid="u-t"),
            facts(opbuilders.pod("tiny", "verifier", 0, node="n1", ready=False, phase="Succeeded"), uid="u-v")]
    nodes = {"n1": nodeloss.node_facts(node("n1", "False", T0), "n1"),
             "n0": nodeloss.node_facts(node("n0", "True", T0), "n0")}
    v = nodeloss.judge(pods, nodes, now=T0 + dt.timedelta(seconds=60), grace=GRACE)
    (lost,) = v.lost
    assert (lost.pod, lost.uid, lost.node) == ("tiny-generator-0", "u-g", "n1") and v.nodes == ["n1"]
    f = lost.failure
    assert (f.role, f.reason, f.node, f.attempt, f.exit_code) == ("generator", "NodeLost", "n1", 0, None)
    assert f.ident == "u-g/NodeLost", "one loss of one pod is one failure, however many passes see it"
    assert v.requeue_after is None
    assert "n1" in nodeloss.message(v, "n1", GRACE) and "tiny-generator-0" in nodeloss.message(v, "n1", GRACE)


def test_a_node_not_ready_since_an_unknown_time_is_never_lost_at_first_sight() -> None:
    pods = [facts(opbuilders.pod("tiny", "generator", 0, node="n1", ready=False))]
    for raw in (None, {"status": {}}):
        v = nodeloss.judge(pods, {"n1": nodeloss.node_facts(raw, "n1")}, now=T0, grace=GRACE)
        assert v.lost == () and v.requeue_after == GRACE


def test_grace_is_bounded() -> None:
    assert nodeloss.clamp_grace(0) == nodeloss.GRACE_MIN_S and nodeloss.clamp_grace(1e9) == nodeloss.GRACE_MAX_S
    assert nodeloss.clamp_grace(30) == 30


class NodeCluster:
    """Just what a reconcile pass calls, with pods and nodes."""

    def __init__(self, job: dict[str, Any], pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any]]) -> None:
        self.job, self.pods, self.nodes = job, pods, nodes
        self.events: list[tuple[str, str]] = []
        self.force_deleted: list[tuple[str, str]] = []
        self.node_reads: list[str] = []

    def get_rljob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.pods)

    def get_node_lease(self, name: str) -> dict[str, Any] | None:
        return None      # no Lease readable: only the Ready condition speaks for a node

    def get_node(self, name: str) -> dict[str, Any] | None:
        self.node_reads.append(name)
        return self.nodes.get(name)

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self.force_deleted.append((name, uid))
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]

    def apply(self, obj: dict[str, Any]) -> None:
        pass

    def delete(self, obj: dict[str, Any], **_: Any) -> None:
        pass

    def create_if_absent(self, obj: dict[str, Any]) -> bool:
        return True

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.job["status"] = status

    def post_event(self, job: dict[str, Any], *, type: str, reason: str, message: str, now: str) -> None:
        self.events.append((reason, message))


def running_gang(lost_node: str) -> list[dict[str, Any]]:
    pods = []
    for role in contract.ROLES:
        on_lost = role == "generator"
        p = opbuilders.pod("tiny", role, 0, node=lost_node if on_lost else "n0", ready=not on_lost)
        p["metadata"]["uid"] = f"u-{role}"
        pods.append(p)
    return pods


def test_a_pass_fails_the_lost_pods_names_the_node_and_force_deletes_them_once() -> None:
    doc = load.dump(opbuilders.job("tiny"))
    doc["metadata"].update(uid="u-job", generation=1, creationTimestamp="2026-11-22T11:00:00Z")
    fake = NodeCluster(doc, running_gang("n1"), {"n0": node("n0", "True", T0), "n1": node("n1", "Unknown", T0)})
    key, cache = ("ns", "tiny"), reconcile.ApplyCache()

    early = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: T0 + dt.timedelta(seconds=20),
                                node_loss_grace=GRACE)
    assert fake.node_reads == ["n1"], "only the node of the pod that is not ready"
    assert not fake.force_deleted and reasons.NODE_LOST not in [r for r, _ in fake.events]
    assert early.requeue_after is not None and early.requeue_after <= 40.0

    late = T0 + dt.timedelta(seconds=61)
    out = reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: late, node_loss_grace=GRACE)
    assert fake.force_deleted == [("tiny-generator-0", "u-generator")]
    (msg,) = [m for r, m in fake.events if r == reasons.NODE_LOST]
    assert "node n1" in msg and "tiny-generator-0" in msg
    st = fake.job["status"]
    assert st["lastFailure"]["reason"] == "NodeLost" and st["lastFailure"]["node"] == "n1"
    assert st["lastFailure"]["pod"] == "tiny-generator-0" and out.decision is not None
    restarts = st.get("restarts", 0)
    assert restarts == 1 and st["attempt"] == 1, st    # the default policy: RestartAll from the checkpoint

    # the pod is re-listed once more (a stale list) before its deletion shows: acted on once, deleted again only
    fake.pods = running_gang("n1")
    reconcile.reconcile(fake, key, image="img", cache=cache, clock=lambda: late, node_loss_grace=GRACE)
    assert fake.job["status"].get("restarts", 0) == restarts and fake.job["status"]["attempt"] == 1
