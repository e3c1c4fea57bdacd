"""Fault campaign, cluster mode (issue 31 item 6): the tiny RLJob on two real nodes, hit by pod kills, node losses and
network partitions, then checked for lost and repeated steps. ``bench/fault_campaign.py --cluster`` runs it.

Neighbours: ``e2e/run_real.py`` (the operator as a subprocess, the RLJob's pods followed, trainer 0's step records),
``e2e/node/extra-node.sh`` (``lose`` / ``up`` / ``partition`` / ``heal`` of node kf-real-1), ``e2e/run_nodes.py``
(the two-node cluster). Only node 1 is ever hit (node 0 hosts CoreDNS and the apiserver's address).

```
 apply ─▶ trainer 0's first step ─▶ fault k (kind from the plan) ─▶ recovered: a step beyond the one before it
      ▲                                                          (node loss: then `up`, kf-real-1 Ready again)  │
      └──────────────────────────── k < requested and the job still trains ◀───────────────────────────────────┘
```

Faults (``plan``: node losses and partitions as asked, the rest pod kills, in a seeded random order;
recovery: from the end of its delivery, a partition's from the heal, to a step beyond the one before it):
- ``pod_kill``: SIGKILL to the role process of a random pod of the job (``kubectl exec``; the container exits 137);
- ``node_loss``: SIGKILL to kf-real-1's kubelet, kube-proxy, containerd, shims and every process of its pods; the
  operator fails the lost pods (``NodeLost``) after the node lifecycle controller's grace and its own, and
  force-deletes them; after recovery the node rejoins (``extra-node.sh 1 up``) before the next fault;
- ``partition``: every packet between kf-real-1 and the rest dropped for ``--partition-seconds`` (no process killed);
- ``long_partition``: the same for longer than the node lifecycle controller's grace plus the operator's node-loss
  grace (``--long-partition-seconds``, by default both plus 20 s): the operator force-deletes the node's pods while
  their containers still run, and when the partition heals the old ones (a trainer among them) come back beside
  their replacements: fencing refuses their writes (``fencedWrites``);
- ``env_kill``: SIGKILL to the role process of a random environment server (a verifier pod of the multi-turn job,
  ``examples/tiny-multiturn.yaml``, which the campaign runs when any is asked) while the job trains: its episodes
  in flight end ``env_lost`` and are re-sampled, never trained with reward 0 (``infraMaskedRollouts``).

Steps are sized from the faults (``STEPS_PER_FAULT`` each: the steps trained between faults and those retrained
from a checkpoint), and when the job still ends (or the deadline comes) before every fault was delivered, the JSON
says so: ``faultsRequested``, ``faultsDelivered``, ``faultsNotDeliveredReason``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# The real-pod drivers and the test cluster's package, from the harness's editable install (e2e/pyproject.toml).
import realjob
import run_real
from kfcluster import harness, kube, lifecycle
from node import realnode

import common

NODE = 1
EXTRA_NODE = realnode.SCRIPTS_DIR / "extra-node.sh"
STEPS_PER_FAULT = 8             # steps a fault may use: 1-2 between two faults, up to 4 retrained from a checkpoint
NODE_LOSS_GRACE_S = 10          # the operator's --node-loss-grace-seconds
BASE_KINDS = ("pod_kill", "node_loss", "partition")    # always in the JSON's by-kind fields; the others when asked
KINDS = (*BASE_KINDS, "long_partition", "env_kill")
MULTITURN = realjob.ROOT / "examples" / "tiny-multiturn.yaml"   # the environment servers are its verifiers
LONG_PARTITION_MARGIN_S = 20.0  # a long partition outlasts the node controller's grace + the node-loss grace by this


def log(text: str) -> None:
    print(f"fault_campaign {time.strftime('%H:%M:%S')}: {text}", file=sys.stderr, flush=True)


def plan(*, faults: int, node_losses: int, partitions: int, rng: random.Random, long_partitions: int = 0,
         env_kills: int = 0) -> list[str]:
    """The kinds of the faults to deliver, in order: node losses, partitions, long partitions and environment-server
    kills as asked, pod kills for the rest."""
    asked = node_losses + partitions + long_partitions + env_kills
    if asked > faults:
        raise ValueError(f"{node_losses} node losses + {partitions} partitions + {long_partitions} long partitions + "
                         f"{env_kills} environment-server kills > {faults} faults")
    kills = faults - asked
    kinds = (["node_loss"] * node_losses + ["partition"] * partitions + ["long_partition"] * long_partitions
             + ["env_kill"] * env_kills + ["pod_kill"] * kills)
    rng.shuffle(kinds)
    return kinds


def manifest(*, faults: int, episodes: bool = False) -> dict[str, Any]:
    """The tiny RLJob with its trainer preferably apart from its generator (so a node fault hits a role and the job
    still fits on node 0 alone), steps sized from the faults, and a failure policy fit for the campaign;
    ``episodes``: the multi-turn job (``examples/tiny-multiturn.yaml``: its verifiers are the environment servers)."""
    import run_nodes  # (also points the pods at this checkout's sources in a worktree)

    steps = max(40, STEPS_PER_FAULT * faults + 10)
    doc: dict[str, Any] = run_nodes.node_loss_manifest(steps, base=realjob.load_tiny(MULTITURN) if episodes else None)
    doc["spec"]["failurePolicy"] = {"maxRestarts": 3 * faults + 2,
                                    "rules": [{"action": "RestartRole", "roles": ["generator", "verifier"]}]}
    return doc


@dataclasses.dataclass
class Fault:
    kind: str
    step: int                                   # trainer 0's step when it was delivered
    at: float                                   # time.monotonic() once delivered (a partition: once healed)
    detail: dict[str, Any]
    recovery_s: float | None = None
    left_running: bool = False                  # the phase has read other than Running since the fault


def recovered(fault: Fault, *, step: int, phase: str | None, on_node: list[str]) -> bool:
    """Has the job recovered from ``fault``? A step beyond the one it came at is not enough alone: right after a
    kill the trainer can still finish a step from rollouts already made (a generator kill "recovered" in 1.0 s, a
    node loss in 1.3 s, so the node came back before it was ever NotReady). A fault that hit the job's pods (a pod
    kill; a node loss with pods on the node) has recovered once the phase, having left Running, reads Running again
    with a step beyond, and for a node loss no pod of the job is left on the node (the operator force-deleted them).
    A partition, or a node loss that hit no pod: a step beyond (after the heal)."""
    if step <= fault.step:
        return False
    if fault.kind in ("pod_kill", "env_kill") or (fault.kind in ("node_loss", "long_partition")
                                                  and fault.detail.get("pods")):
        return fault.left_running and phase == "Running" and not (fault.kind == "node_loss" and on_node)
    return True


class Campaign:
    def __init__(self, *, run: run_real.Run, cluster: lifecycle.Cluster, rng: random.Random,
                 partition_s: float, long_partition_s: float = 0.0) -> None:
        self.run, self.cluster, self.rng, self.partition_s = run, cluster, rng, partition_s
        self.long_partition_s = long_partition_s
        self.node = realnode.node_name(NODE)

    def script(self, action: str) -> str:
        res = subprocess.run(["bash", str(EXTRA_NODE), self.cluster.workdir, str(NODE), action], capture_output=True,
                             text=True, timeout=240)
        if res.returncode != 0:
            raise RuntimeError(f"extra-node.sh {action}: rc {res.returncode}: {res.stderr[-2000:]}")
        return res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""

    def on_node(self, pods: list[dict[str, Any]]) -> list[str]:
        return sorted(p["metadata"]["name"] for p in pods if p.get("spec", {}).get("nodeName") == self.node
                      and not p["metadata"].get("deletionTimestamp"))

    def deliver(self, kind: str, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        if kind in ("pod_kill", "env_kill"):
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp") and any(
                "running" in (cs.get("state") or {}) for cs in p.get("status", {}).get("containerStatuses") or [])
                and (kind == "pod_kill" or p["metadata"]["labels"].get(run_real.LABEL_ROLE) == "verifier")]
            if not live:
                return None
            pod = self.rng.choice(sorted(live, key=lambda p: p["metadata"]["name"]))
            role = pod["metadata"]["labels"].get(run_real.LABEL_ROLE, "?")
            res = self.run.k.run("exec", "-n", self.run.ns, pod["metadata"]["name"], "-c", role, "--", "sh", "-c",
                                 f"kill -KILL $(cat {realjob.ROLE_PID_FILE})", check=False, timeout_s=60)
            if res.returncode != 0:         # the pod went meanwhile (a restart): not delivered, tried again
                log(f"kill in {pod['metadata']['name']} failed (rc {res.returncode}): {res.stderr.strip()[-300:]}")
                return None
            return {"pod": pod["metadata"]["name"], "role": role, "node": pod.get("spec", {}).get("nodeName")}
        hit = self.on_node(pods)
        if kind == "node_loss":
            self.script("lose")
            return {"node": self.node, "pods": hit}
        seconds = self.long_partition_s if kind == "long_partition" else self.partition_s
        t0 = time.monotonic()
        self.script("partition")
        time.sleep(seconds)
        self.script("heal")
        detail: dict[str, Any] = {"node": self.node, "pods": hit, "seconds": seconds}
        if kind == "long_partition":     # its recovery (the replacements on node 0) runs during it: counted from its start
            detail["_t0"] = t0
        return detail

    def node_back(self) -> None:
        self.script("up")
        kube.wait_for(f"{self.node} Ready again", lambda: self.node in realnode.ready_real_nodes(self.run.k) or None,
                      timeout_s=180, interval_s=2.0)


def records(run: run_real.Run) -> list[tuple[str, list[int]]]:
    """(follower key, steps) of every trainer 0 container followed so far, in the order they were started."""
    return [(key, run_real.step_sequence(f.path.read_text(errors="replace"))[1]) for key, f in run.followers.items()
            if key.startswith("trainer:")]


def last_step(run: run_real.Run) -> int:
    """Trainer 0's newest step record (the newest container's last record; 0 before any)."""
    steps = [s for _, s in records(run) if s]
    return steps[-1][-1] if steps else 0


def execute(*, run: run_real.Run, campaign: Campaign, kinds: list[str], job: dict[str, Any],
            deadline_s: float) -> tuple[list[Fault], str | None, dict[str, Any]]:
    """Apply ``job``, deliver ``kinds`` one after another (each once the previous one has recovered), then wait for
    the job to finish. Returns the faults, why some were not delivered (None when all were), the final status."""
    run.k.apply(job)
    t0 = time.monotonic()
    faults: list[Fault] = []
    reason: str | None = None
    pending: Fault | None = None
    node_down = False
    status: dict[str, Any] = {}
    while time.monotonic() - t0 < deadline_s:
        try:
            status = run.get_job().get("status") or {}
            pods = run.get_pods()
        except RuntimeError as exc:     # an API server starved on a loaded machine: look again (within the deadline)
            log(f"reading the job failed, looking again: {str(exc)[:300]}")
            time.sleep(2.0)
            continue
        for p in pods:
            run.seen[p["metadata"]["uid"]] = p
        run.follow_new_containers(pods)
        run.report_failures(pods)
        phase, step = status.get("phase"), last_step(run)
        if pending is not None and phase != "Running":
            pending.left_running = True
        if pending is not None and recovered(pending, step=step, phase=phase, on_node=campaign.on_node(pods)):
            pending.recovery_s = round(time.monotonic() - pending.at, 1)
            log(f"fault {len(faults)} ({pending.kind}) recovered in {pending.recovery_s}s (step {step})")
            pending = None
        if pending is None and node_down:
            campaign.node_back()
            node_down = False
        if phase in ("Succeeded", "Failed"):
            if len(faults) < len(kinds):
                reason = (f"the job ended ({phase}, step {(status.get('progress') or {}).get('step')}) after "
                          f"{len(faults)} of {len(kinds)} faults")
            break
        if pending is None and len(faults) < len(kinds) and step > 0:
            time.sleep(campaign.rng.uniform(0.5, 4.0))
            kind = kinds[len(faults)]
            step = last_step(run)
            try:
                detail = campaign.deliver(kind, run.get_pods())
            except (RuntimeError, subprocess.TimeoutExpired) as exc:     # the node scripts failed: say so, stop
                reason = f"fault {len(faults) + 1} ({kind}) could not be delivered: {exc}"[:1000]
                log(reason)
                break
            if detail is None:
                continue
            at = float(detail.pop("_t0", time.monotonic()))
            faults.append(Fault(kind=kind, step=step, at=at, detail=detail))
            pending, node_down = faults[-1], kind == "node_loss"
            log(f"fault {len(faults)}/{len(kinds)}: {kind} at step {step}: {detail}")
        time.sleep(0.5)
    else:
        reason = f"deadline {deadline_s:.0f}s reached after {len(faults)} of {len(kinds)} faults" \
            if len(faults) < len(kinds) else None
        status = run.get_job().get("status") or {}
    if node_down:
        campaign.node_back()
    return faults, reason, status


def summarize(*, faults: list[Fault], kinds: list[str], reason: str | None, status: dict[str, Any],
              trainer_logs: list[str], steps: int, policy: dict[str, Any], started: float,
              run_dir: pathlib.Path) -> dict[str, Any]:
    """The local mode's JSON fields (a fault is a ``kill``), plus the faults by kind and the delivery counts."""
    line: list[int] = []
    records_all: list[dict[str, Any]] = []
    for text in trainer_logs:            # the lineage: each trainer log's steps after the step it resumed from
        resumed, seen = run_real.step_sequence(text)
        recs = [d for d in run_real.json_lines(text) if isinstance(d.get("step"), int) and "mean_reward" in d
                and "done" not in d]
        if resumed is None and not seen:
            continue
        keep = resumed or 0
        records_all = [r for r in records_all if r["step"] <= keep] + recs
        line = line[:keep] + seen
    total = sum(len(run_real.step_sequence(t)[1]) for t in trainer_logs)
    masked = sum(int(d.get("infra_masked_rollouts") or 0) for t in trainer_logs for d in run_real.json_lines(t)
                 if isinstance(d.get("step"), int) and "done" not in d)
    fenced = status.get("fencedWrites") or {}
    versions = [r.get("policy_version") for r in records_all]
    recovery = [f.recovery_s for f in faults if f.recovery_s is not None]
    q = statistics.quantiles(recovery, n=20) if len(recovery) >= 2 else recovery * 19
    roles = status.get("roles") or {}
    return {
        "mode": "cluster",
        "faultsRequested": len(kinds), "faultsDelivered": len(faults), "faultsNotDeliveredReason": reason,
        "faults_by_kind": {k: sum(1 for f in faults if f.kind == k) for k in KINDS if k in BASE_KINDS or k in kinds},
        "kills": len(faults),
        "kills_by_role": {r: sum(1 for f in faults if f.kind == "pod_kill" and f.detail.get("role") == r)
                          for r in ("generator", "verifier", "trainer")},
        "kills_during": {"sync": 0, "checkpoint": 0, "anytime": len(faults)},
        "steps": len(set(line)), "steps_wanted": steps,
        "lost_steps": len(set(range(1, steps + 1)) - set(line)),
        "repeated_steps": len(line) - len(set(line)),
        "retrained_steps": total - len(line),
        "policy_version_monotonic": bool(versions) and all(
            a is not None and b is not None and b > a for a, b in zip(versions, versions[1:])),
        "restarts": status.get("restarts"),
        "restarts_by_role": {r: (roles.get(r) or {}).get("restarts", 0) for r in ("generator", "verifier", "trainer")},
        "recovery_seconds_p50": round(statistics.median(recovery), 2) if recovery else None,
        "recovery_seconds_p95": round(q[18], 2) if recovery else None,
        "recovery_seconds_by_kind": {k: [f.recovery_s for f in faults if f.kind == k] for k in KINDS
                                     if k in BASE_KINDS or k in kinds},
        "node_faults_hit": [{"kind": f.kind, "step": f.step, "pods": f.detail.get("pods")} for f in faults
                            if f.kind != "pod_kill"],
        "lastFailure": status.get("lastFailure"),
        # the RLJob's fencing counts (cumulative in its status) and the rollouts masked for infrastructure, summed
        # over every step record of every trainer container of the run (a retrained step's masking happened too)
        "fencedWrites": {k: int(fenced.get(k) or 0) for k in ("checkpoints", "pushes", "reports")},
        "fencedWritesTotal": sum(int(fenced.get(k) or 0) for k in ("checkpoints", "pushes", "reports")),
        "infraMaskedRollouts": masked,
        "succeeded": status.get("phase") == "Succeeded",
        "failure_policy": policy,
        "wall_seconds": round(time.time() - started, 1),
        "run_dir": str(run_dir),
    }


def main(*, faults: int, node_losses: int, partitions: int, partition_s: float, seed: int, run_dir: str | None,
         deadline_s: float, long_partitions: int = 0, long_partition_s: float | None = None,
         env_kills: int = 0) -> int:
    rng = random.Random(seed)
    kinds = plan(faults=faults, node_losses=node_losses, partitions=partitions, rng=rng,
                 long_partitions=long_partitions, env_kills=env_kills)
    started = time.time()
    # One set of real nodes per machine: the campaign holds the real-node lock for its whole run, as `make e2e-nodes`
    # and the real-node test runs do (a `make test` started meanwhile waits for it instead of failing its fixtures).
    with realnode.real_node_lock(wait_s=float(os.environ.get("KF_REAL_NODE_WAIT_S", "900")), say=log):
        return _main_locked(kinds=kinds, rng=rng, started=started, partition_s=partition_s, run_dir=run_dir,
                            deadline_s=deadline_s, long_partitions=long_partitions,
                            long_partition_s=long_partition_s, env_kills=env_kills)


def _main_locked(*, kinds: list[str], rng: random.Random, started: float, partition_s: float, run_dir: str | None,
                 deadline_s: float, long_partitions: int, long_partition_s: float | None, env_kills: int) -> int:
    faults = len(kinds)
    import run_nodes

    cluster, cluster_started = run_nodes.acquire()
    work = pathlib.Path(run_dir or tempfile.mkdtemp(prefix="fault-campaign-cluster-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    doc = manifest(faults=faults, episodes=env_kills > 0)
    monitor = realnode.node_monitor(cluster.workdir)
    long_s = long_partition_s if long_partition_s is not None else \
        monitor["node-monitor-grace-period"] + NODE_LOSS_GRACE_S + LONG_PARTITION_MARGIN_S
    steps = int(doc["spec"]["algorithm"]["steps"])
    k = cluster.kubectl
    harness.K(kubectl=k.binary, kubeconfig=k.kubeconfig).ensure_crd()
    ns = f"fault-campaign-{rng.randrange(16**6):06x}"
    k.run("create", "namespace", ns)
    checkpoints = work / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    checkpoints.chmod(0o777)            # the pods run as UID 1000; a hostPath keeps the host's modes
    op = harness.Operator(kubeconfig=k.kubeconfig, log_path=work / "operator.log",
                          extra=("--namespace", ns, "--node-loss-grace-seconds", str(NODE_LOSS_GRACE_S)))
    op.start()
    run = run_real.Run(k=k, namespace=ns, name="tiny", workdir=work, kill_after_step=None, timeout_s=deadline_s)
    log(f"plan: {kinds}; {steps} steps; namespace {ns}; node monitor {monitor}; long partitions {long_s:.0f}s")
    try:
        job = realjob.manifest(name="tiny", namespace=ns, checkpoint_dir=checkpoints, base=doc)
        done, reason, status = execute(run=run, campaign=Campaign(run=run, cluster=cluster, rng=rng,
                                                                  partition_s=partition_s, long_partition_s=long_s),
                                       kinds=kinds, job=job, deadline_s=deadline_s)
    finally:
        try:        # never let a hung heal skip the rest of the clean-up (it once left the whole cluster running)
            subprocess.run(["bash", str(EXTRA_NODE), cluster.workdir, str(NODE), "heal"], capture_output=True,
                           timeout=60)
        except subprocess.TimeoutExpired:
            log("heal timed out; the node goes with the cluster")
        logs = [f.finish() for key, f in run.followers.items() if key.startswith("trainer:")]
        op.stop()
        (work / "pods.json").write_text(json.dumps(list(run.seen.values()), indent=1))
        k.run("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout_s=150)
        if cluster_started:
            lifecycle.down(workdir=cluster.workdir)
    result = summarize(faults=done, kinds=kinds, reason=reason, status=status, trainer_logs=logs, steps=steps,
                       policy=doc["spec"]["failurePolicy"], started=started, run_dir=work)
    result["load_average"] = common.load_average()
    print(json.dumps(result), flush=True)
    result["long_partition_seconds"] = long_s if long_partitions else None
    ok = result["succeeded"] and not result["lost_steps"] and not result["repeated_steps"]
    return 0 if ok and result["policy_version_monotonic"] and reason is None else 1
