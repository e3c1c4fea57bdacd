"""Fencing on two real nodes (issue 39 item 1; docs/fencing.md): a trainer partitioned past the grace comes back
beside its replacement, and the checkpoint it then commits is refused.

```
 trainer on kf-real-1 trains step 12 ─▶ partition kf-real-1 (processes alive) ─▶ progress quiet, kf-real-1's
   kubelet Lease lapsed, kf-real-0's renewed (operator/trainersilence.py; no node controller) ─▶ operator: NodeLost,
   trainer epoch 2, force-delete ─▶ replacement on kf-real-0 claims the store (epoch 2, resumes from step 10) and
   trains ─▶ heal (no earlier than the old trainer's push in flight ran out) ─▶ kubelet stops the old trainer (its pod is gone) ─▶ its stop checkpoint (epoch 1, steps 11.. it
   alone trained) is refused: fence/fenced-e1-step<n>, status.fencedWrites
```

The tiny RLJob with its generator and verifier pinned to kf-real-0 and its trainer preferably apart from the
generator (so on kf-real-1), checkpoints every 10 steps in a host folder both nodes mount (the shared volume a
trainer's replacement on another node reads). What the run determines is asserted: the trainer was on the
partitioned node and alive at the heal; the operator failed it (NodeLost) and raised the epoch; the replacement
claimed the store from its checkpoint; the operator found the node lost by the job's own evidence (its
NodeLost event says the trainer's node does not answer, before the node controller's grace); the job Succeeded with every step in its lineage once; no checkpoint of epoch 1
beyond the claim's step is trusted; and the old trainer's commit, which it makes whenever it trained beyond its last
checkpoint (its log says so), is refused and counted. Its weight push is not asserted here: after the partition the
old trainer gets no rollouts (the generators send them to trainer 0's name, now its replacement), so it trains no
step to push; tests/runtime/test_fencing_processes.py refuses a stale push between real trainer processes.

In ``make test`` (the e2e lane, on its session cluster with kf-real-1 added; kwokctl's node-monitor grace of 3m20s
no longer matters: the partition lasts until the job's own detection and the replacement's first steps) and in
``make e2e-nodes``' cluster (grace 40 s). Bounds follow the job's ``peerSilenceSeconds``, the partitioned kubelet's
Lease duration and the running kube-controller-manager's settings (``realnode.node_monitor``).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import twonodes
from kfcluster import kube, lifecycle
from kubeforge.operator import timefmt
from node import realnode

# bounded below by the job's detection, two vLLM starts and the run (RUN_BOUND_S + the heal's bound)
pytestmark = [pytest.mark.realnode, pytest.mark.cluster, pytest.mark.timeout(3300)]

# The old trainer's stop checkpoint is refused seconds after the heal, and counted in status.fencedWrites only by a
# report of the current trainer: the replacement must still be training then (2026-11-30, 120 steps: it had
# finished, the refusal stood in the store and no report counted it). 240 steps leave it ~a minute of margin.
STEPS = 240
CHECKPOINT_EVERY = 10
PARTITION_AFTER_STEP = 12      # past the checkpoint of step 10: steps 11.. are the old trainer's alone
REPLACEMENT_STEPS = 2          # the replacement trains this many steps beyond its resume before the heal
NODE = 1
GRACE_S = 10                   # the operator's node-loss grace (the chart's minimum)
RUN_BOUND_S = 1200             # apply -> Succeeded besides the partition: two vLLM starts on loaded cores, 240 steps
START_BOUND_S = 900            # the replacement's pods, a vLLM start and REPLACEMENT_STEPS steps on loaded cores
# The old trainer's weight push in flight at the partition waits out the broadcast's timeout (120 s by default) and
# its SIGTERM at the heal only ends the loop after it: a heal before that left it no time for its stop checkpoint
# within the pod's grace (2026-11-30: killed 60 s after the heal, nothing committed to refuse). A short timeout
# (a tiny model's broadcast takes well under a second) and a heal no earlier than it plus a margin.
WEIGHT_SYNC_TIMEOUT_S = 20
PUSH_MARGIN_S = 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[lifecycle.Cluster]:
    with twonodes.cluster() as running:
        yield running


def manifest() -> dict[str, Any]:
    import run_nodes

    doc = run_nodes.node_loss_manifest(STEPS)
    doc["spec"]["checkpoint"] = {**doc["spec"].get("checkpoint", {}), "everySteps": CHECKPOINT_EVERY}
    doc["spec"]["weightSync"] = {**doc["spec"].get("weightSync", {}), "timeoutSeconds": WEIGHT_SYNC_TIMEOUT_S}
    roles = doc["spec"]["roles"]
    for role in ("generator", "verifier"):      # kept on kf-real-0: only the trainer is cut off
        roles.setdefault(role, {})["nodeSelector"] = {realnode.HOSTNAME_LABEL: realnode.node_name(0)}
    return doc


def kubelet_lease_s(k: kube.Kubectl, node: str) -> float:
    """The duration of ``node``'s kubelet Lease (renewed every quarter of it); the kubelet's default, 40 s, while a
    node that just joined has not created it yet."""
    got = k.run("get", "lease", "-n", "kube-node-lease", node, "-o", "json", check=False)
    spec = (json.loads(got.stdout).get("spec") or {}) if got.returncode == 0 and got.stdout.strip() else {}
    return float(spec.get("leaseDurationSeconds") or 40)


def stale_store_checks(checkpoints: pathlib.Path) -> dict[str, Any]:
    """The store's fencing facts: claims (epoch -> resumed from), refused commits, checkpoints by (step, epoch)."""
    from kubeforge.runtime.learner import fence

    roots = sorted({p.parent for p in checkpoints.rglob("fence")})
    out: dict[str, Any] = {"roots": [str(r) for r in roots], "claims": {}, "fenced": [], "checkpoints": []}
    for root in roots:
        out["claims"].update({c.epoch: c.resumed_from for c in fence.claims(root)})
        out["fenced"] += sorted(p.name for p in (root / "fence").glob("fenced-*"))
        out["checkpoints"] += sorted((int(d.name.split("-")[1]), fence.epoch_of(d)) for d in root.glob("step-*")
                                     if d.is_dir() and d.name.split("-")[1].isdigit())
    return out


def test_a_trainer_partitioned_past_the_grace_cannot_commit_beside_its_replacement(
        cluster: lifecycle.Cluster) -> None:
    import run_real
    from test_two_nodes import lineage

    k = cluster.kubectl
    node = realnode.node_name(NODE)
    monitor = realnode.node_monitor(cluster.workdir)
    doc = manifest()
    peer_silence = float((doc["spec"].get("failurePolicy") or {}).get("peerSilenceSeconds") or 10)
    lease_s = kubelet_lease_s(k, node)
    # the job's own detection: progress quiet for peerSilenceSeconds, the kubelet's renewal (a quarter of its Lease)
    # overdue, another kubelet's renewal since: well within two Lease durations past the silence (passes late under
    # load included); the replacement then needs its pods and a vLLM start: the heal waits for its steps
    detect_bound_s = peer_silence + 2 * lease_s
    heal_bound_s = detect_bound_s + START_BOUND_S
    timeout_s = RUN_BOUND_S + heal_bound_s
    t_start = time.monotonic()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kf-fence-real-"))
    workdir.chmod(0o755)
    (workdir / "rljob.yaml").write_text(json.dumps(doc))
    cut: dict[str, Any] = {}
    healed = threading.Event()

    def script(action: str) -> None:
        subprocess.run(["bash", str(twonodes.EXTRA_NODE), cluster.workdir, str(NODE), action], check=True,
                       timeout=120)

    def pods_of(ns: str) -> list[dict[str, Any]]:
        return list(k.get_json("pods", "-n", ns)["items"])

    def node_lost_events(ns: str) -> list[dict[str, Any]]:
        """The operator's NodeLost events (read before the run ends: its namespace goes with it)."""
        try:
            items = k.get_json("events", "-n", ns)["items"]
        except RuntimeError:
            return []
        return [{"at": e.get("firstTimestamp") or e.get("eventTime"), "message": e.get("message", "")}
                for e in items if e.get("reason") == "NodeLost"]

    def heal_when_replaced(ns: str, old_uid: str) -> None:
        """Heal once the replacement trainer has trained REPLACEMENT_STEPS beyond its resume and the old trainer's
        push in flight has run out (or at the bound)."""
        deadline = time.monotonic() + heal_bound_s
        try:
            while time.monotonic() < cut["t"] + WEIGHT_SYNC_TIMEOUT_S + PUSH_MARGIN_S:
                time.sleep(2.0)
            while time.monotonic() < deadline:
                try:
                    pods = pods_of(ns)
                except RuntimeError:            # an API server slow under load: look again
                    pods = []
                for p in pods:
                    labels = p["metadata"].get("labels", {})
                    if p["metadata"]["uid"] == old_uid or labels.get(run_real.LABEL_ROLE) != "trainer":
                        continue
                    report = json.loads((p["metadata"].get("annotations") or {}).get(
                        "kubeforge.dev/progress", "{}") or "{}")
                    if int(report.get("step") or 0) >= CHECKPOINT_EVERY + REPLACEMENT_STEPS:
                        cut.update(replacement=p["metadata"]["name"], replacement_node=p["spec"].get("nodeName"),
                                   replacement_step=report.get("step"), node_lost=node_lost_events(ns))
                        return
                time.sleep(2.0)
            cut["heal_bound_reached"] = True
        finally:
            cut["old_alive_at_heal"] = bool(run_real._pod_pids(old_uid))
            script("heal")
            cut["healed_after_s"] = round(time.monotonic() - cut["t"], 1)
            print(f"\n[fence-real] healed {node}: {cut}", file=sys.stderr, flush=True)
            healed.set()

    def partition(step: int, pods: list[dict[str, Any]]) -> dict[str, Any]:
        trainer = next(p for p in pods if p["metadata"]["labels"].get(run_real.LABEL_ROLE) == "trainer"
                       and not p["metadata"].get("deletionTimestamp"))
        placed = {p["metadata"]["labels"].get(run_real.LABEL_ROLE, "?"): p.get("spec", {}).get("nodeName")
                  for p in pods}
        cut.update(step=step, placed=placed, old_uid=trainer["metadata"]["uid"], t=time.monotonic(),
                   wall=time.time())
        if placed.get("trainer") != node:
            cut["not_on_node"] = True           # asserted after the run: nothing to partition
            healed.set()
            return dict(cut)
        script("partition")
        print(f"\n[fence-real] partitioned {node} at step {step}: {placed}", file=sys.stderr, flush=True)
        threading.Thread(target=heal_when_replaced, args=(trainer["metadata"]["namespace"], cut["old_uid"]),
                         daemon=True).start()
        return dict(cut)

    try:
        result = run_real.run(cluster=cluster, workdir=workdir / "run", kill_after_step=PARTITION_AFTER_STEP,
                              timeout_s=timeout_s, base=workdir / "rljob.yaml", fault=partition,
                              chart_values=(f"nodeLossGraceSeconds={GRACE_S}",))
    finally:
        if cut and not healed.wait(timeout=heal_bound_s + 60):
            script("heal")
    # the old trainer's commit comes after the heal (its kubelet stops it: its pod is gone); the store says when
    store = stale_store_checks(workdir / "run" / "checkpoints")
    old_log = next((t for t in result.trainer_logs if t), "")
    old_steps = run_real.step_sequence(old_log)[1]
    stale = bool(old_steps) and max(old_steps) % CHECKPOINT_EVERY != 0    # trained beyond its last checkpoint
    if stale:
        kube.wait_for("the old trainer's stop checkpoint refused", lambda: stale_store_checks(
            workdir / "run" / "checkpoints")["fenced"] or None, timeout_s=300, interval_s=3.0)
        store = stale_store_checks(workdir / "run" / "checkpoints")
    status = result.status
    detected = [e for e in cut.get("node_lost", []) if node in e["message"]]
    first = timefmt.parse(detected[0]["at"]) if detected else None
    detect_s = round(first.timestamp() - cut["wall"], 1) if first is not None else None
    figures = {"cut": cut, "detectSeconds": detect_s, "testSeconds": round(time.monotonic() - t_start, 1),
               "phase": status.get("phase"), "trainerEpoch": status.get("trainerEpoch"),
               "fencedWrites": status.get("fencedWrites"), "lastFailure": status.get("lastFailure"),
               "oldTrainerSteps": old_steps[-3:], "store": {k_: v for k_, v in store.items() if k_ != "checkpoints"},
               "nodeMonitor": monitor}
    print(f"\n[fence-real] {json.dumps(figures)}", file=sys.stderr, flush=True)
    assert not cut.get("not_on_node"), f"the trainer was not placed on {node}: nothing to fence ({cut})"
    assert cut.get("old_uid"), "the partition never came (the job ended before its step)"
    assert not cut.get("heal_bound_reached"), f"the replacement did not train within {heal_bound_s:.0f}s: {cut}"
    assert cut["old_alive_at_heal"], "the old trainer died during the partition: nothing came back to fence"
    assert cut.get("replacement_node") == realnode.node_name(0), cut
    # found lost by the job's own evidence (operator/trainersilence.py), not by the node controller's grace
    # (the same pass may also write "has not answered since ...": events of one second come in either order)
    assert any("holds a trainer and does not answer" in e["message"] for e in detected), cut.get("node_lost")
    controller_s = monitor["node-monitor-grace-period"] + monitor["node-monitor-period"] + GRACE_S
    assert detect_s is not None and detect_s < min(detect_bound_s, controller_s), (detect_s, detect_bound_s, monitor)
    assert result.succeeded, (status, result.failures)
    assert (status.get("trainerEpoch") or 0) >= 2, status
    assert store["claims"].get(2) == CHECKPOINT_EVERY, store       # the replacement resumed from the checkpoint
    assert lineage(result.trainer_logs) == list(range(1, STEPS + 1)), lineage(result.trainer_logs)
    # nothing of epoch 1 beyond the step epoch 2 resumed from is committed; every committed step once
    assert not [s for s, e in store["checkpoints"] if e < 2 and s > CHECKPOINT_EVERY], store["checkpoints"]
    committed = [s for s, _ in store["checkpoints"]]
    assert len(committed) == len(set(committed)), store["checkpoints"]
    if stale:           # the old trainer trained beyond its checkpoint: its stop checkpoint was refused, counted
        assert any(f.startswith("fenced-e000000001-") for f in store["fenced"]), store
        assert ((status.get("fencedWrites") or {}).get("checkpoints") or 0) >= 1, status.get("fencedWrites")
