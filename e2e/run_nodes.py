"""The tiny RLJob across two real nodes (issue 31 item 3): the trainer on one node, the generator on the other.

``roles.trainer.affinity.apartFrom: [generator]`` (required, per node) and ``roles.verifier.affinity.colocateWith:
[generator]`` are the only placement the job states; the scheduler picks the nodes. ``--same-node`` runs the
baseline in the same cluster: the trainer ``colocateWith: [generator]`` too (all three roles on one node).
Each run goes to Succeeded without faults (``e2e/run_real.run``, kill off); from trainer 0's per-step records it
takes the weight-sync bytes and seconds (GB/s per sync) and the seconds the trainer waited for each step's
rollouts, and from the pods the node of every role.

Cluster: ``KF_CLUSTER_NAME`` / the default one when it has two real nodes Ready, else a private one started with
``real_nodes=2`` and stopped afterwards. Prints ``E2E-NODES {json}`` last; exit 0 when the job Succeeded with the
placement asked for.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
from typing import Any

import yaml

_E2E = pathlib.Path(__file__).resolve().parent
if str(_E2E) not in sys.path:
    sys.path.insert(0, str(_E2E))

import realjob  # noqa: E402
import run_real  # noqa: E402
from kfcluster import config as cfg  # noqa: E402
from kfcluster import lifecycle  # noqa: E402
from node import realnode  # noqa: E402


def placement_manifest(*, same_node: bool, steps: int) -> dict[str, Any]:
    """examples/tiny.yaml with the trainer kept apart from (or beside) the generator and the verifier beside the
    generator, ``steps`` steps."""
    doc = realjob.load_tiny()
    doc["spec"]["algorithm"]["steps"] = steps
    roles = doc["spec"]["roles"]
    # The verifier beside the generator in both runs: only the trainer's side of the boundary changes.
    roles.setdefault("verifier", {})["affinity"] = {"colocateWith": ["generator"]}
    roles.setdefault("trainer", {})["affinity"] = {"colocateWith" if same_node else "apartFrom": ["generator"]}
    return doc


#: The node faults' failure rule: a lost generator or verifier comes back alone (RestartRole); the trainer keeps its
#: state and running, and pushes the current policy to the replacement generator as soon as it says READY
#: (docs/recovery.md). A lost trainer still restarts every role from the checkpoint (RestartAll: no rule matches).
NODE_FAULT_RULES = [{"action": "RestartRole", "roles": ["generator", "verifier"]}]


def node_loss_manifest(steps: int, *, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The tiny RLJob (or ``base``) for node faults (the node-loss test, ``bench/fault_campaign.py --cluster``): the
    trainer preferably apart from the generator (mode Preferred: after a node is lost both fit on node 0), the
    verifier preferably beside the generator, ``steps`` steps, and ``NODE_FAULT_RULES`` (the tiny job's own policy
    has no rule: RestartAll, which drained and restarted the trainer on the node that worked too)."""
    doc = base if base is not None else realjob.load_tiny()
    doc["spec"]["algorithm"]["steps"] = steps
    doc["spec"]["failurePolicy"] = {**(doc["spec"].get("failurePolicy") or {}), "rules": NODE_FAULT_RULES}
    roles = doc["spec"]["roles"]
    roles.setdefault("trainer", {})["affinity"] = {"apartFrom": ["generator"], "mode": "Preferred"}
    roles.setdefault("verifier", {})["affinity"] = {"colocateWith": ["generator"], "mode": "Preferred"}
    return doc


def step_figures(trainer_logs: list[str]) -> dict[str, Any]:
    """Weight sync GB/s and rollout wait seconds (medians) from trainer 0's per-step JSON records."""
    recs = [d for t in trainer_logs for d in run_real.json_lines(t) if isinstance(d.get("step"), int)]
    syncs = [(d["weight_sync_bytes"], d["weight_sync_seconds"]) for d in recs
             if d.get("weight_sync_bytes") and d.get("weight_sync_seconds")]
    waits = [d["wait_seconds"] for d in recs[1:] if isinstance(d.get("wait_seconds"), (int, float))]
    rates = [b / s / 1e9 for b, s in syncs if s > 0]
    return {
        "syncs": len(syncs),
        "sync_bytes": syncs[0][0] if syncs else None,
        "sync_seconds_median": round(statistics.median(s for _, s in syncs), 4) if syncs else None,
        "sync_gbps_median": round(statistics.median(rates), 4) if rates else None,
        "rollout_wait_seconds_median": round(statistics.median(waits), 4) if waits else None,
        "rollout_wait_seconds_p90": round(sorted(waits)[int(0.9 * (len(waits) - 1))], 4) if waits else None,
    }


def nodes_of(pods: list[dict[str, Any]]) -> dict[str, list[str]]:
    """role -> the nodes its pods of the last attempt ran on."""
    def attempt(p: dict[str, Any]) -> int:
        return int(p.get("metadata", {}).get("labels", {}).get("kubeforge.dev/attempt", "0") or 0)

    last = max((attempt(p) for p in pods), default=0)
    out: dict[str, set[str]] = {}
    for p in (p for p in pods if attempt(p) == last):
        role = p.get("metadata", {}).get("labels", {}).get(run_real.LABEL_ROLE) or "?"
        node = p.get("spec", {}).get("nodeName")
        if node:
            out.setdefault(role, set()).add(node)
    return {r: sorted(n) for r, n in sorted(out.items())}


def acquire() -> tuple[lifecycle.Cluster, bool]:
    base = cfg.from_env()
    try:
        running = lifecycle.Cluster.load(base.workdir)
        if running.kubectl.readyz() and len(realnode.ready_real_nodes(running.kubectl)) >= 2:
            return running, False
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        pass
    reason = realnode.cannot_host_nodes(2)
    if reason:
        raise SystemExit(f"this machine cannot host two real nodes: {reason}")
    os.environ.setdefault("KF_REAL_NODE_WAIT_S", "300")
    over = realnode.cluster_overrides(workdir=base.workdir, name=base.name)
    return lifecycle.up(cfg.from_env(real_node=True, real_nodes=2, **over)), True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="run_nodes", description=__doc__.split("\n")[0])
    p.add_argument("--same-node", action="store_true", help="baseline: the trainer beside the generator")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--workdir")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    cluster, started = acquire()
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="kf-e2e-nodes-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    manifest = workdir / "rljob.yaml"
    manifest.write_text(yaml.safe_dump(placement_manifest(same_node=args.same_node, steps=args.steps)))
    try:
        result = run_real.run(cluster=cluster, workdir=workdir, kill_after_step=None, timeout_s=args.timeout,
                              base=manifest)
    finally:
        if started and os.environ.get("KF_KEEP_CLUSTER") != "1":
            lifecycle.down(workdir=cluster.workdir)
    placed = nodes_of(result.pods)
    trainer, generator = set(placed.get("trainer", [])), set(placed.get("generator", []))
    apart = bool(trainer and generator and not trainer & generator)
    figures = {"placement": "same-node" if args.same_node else "across-nodes", "nodes": placed,
               "nodesUsed": len(set().union(*placed.values())) if placed else 0, "trainerApartFromGenerator": apart,
               "phase": result.status.get("phase"), "steps": (result.status.get("progress") or {}).get("step"),
               "apply_to_running_s": run_real._r(result.apply_to_running_s),
               "apply_to_succeeded_s": run_real._r(result.apply_to_succeeded_s),
               **step_figures(result.trainer_logs), "workdir": str(workdir)}
    print("E2E-NODES " + json.dumps(figures), flush=True)
    ok = result.succeeded and apart != args.same_node
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
