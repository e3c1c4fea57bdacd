"""Fault campaign: run an RLJob locally and kill -9 random roles at random moments, then check nothing was lost.

    python bench/fault_campaign.py examples/tiny.yaml --kills 20 [--seed 0] [--run-dir DIR] [--deadline S]
    python bench/fault_campaign.py --cluster --kills 10 --node-losses 2 --partitions 2 [--partition-seconds 30]
        [--long-partitions 1 [--long-partition-seconds S]] [--env-kills 2]

``--cluster`` runs the campaign over two real nodes instead (bench/fault_campaign_cluster.py: pod kills, node losses,
network partitions of kf-real-1; the tiny RLJob), with the same JSON fields.

The job runs with its own manifest plus a failure policy fit for the campaign (printed in the result):
``RestartRole`` for generators and verifiers (the trainer keeps running), the default ``RestartAll`` for trainers,
``maxRestarts`` = kills + 2, ``progressDeadlineSeconds`` ``--deadline`` (default 300; a role's start, such as a vLLM
engine load, has 3 times that before it counts as hung: 226 s were seen on the shared 2 cores at load 30), and
enough steps for every kill to land while it trains (``STEPS_PER_KILL`` per kill: the steps trained between two
kills, up to a checkpoint interval waiting for a checkpoint write, and those retrained from a checkpoint; 3 per kill
once let ``--kills 20`` stop at 14 when the steps ran out). When the job still ends first, the JSON says so.
Kills pick a role at random (trainer, generator, verifier); every third kill waits
for the trainer to be in a weight sync and every third+1 in a checkpoint write (read from trainer 0's
``/healthz`` ``activity``), the rest land after a random delay. After each kill the campaign waits for the next
new step (the recovery time) before the next kill.

The last stdout line is JSON: ``faultsRequested``, ``faultsDelivered``, ``faultsNotDeliveredReason`` (null when
every kill was delivered), ``kills``, ``kills_by_role``, ``kills_during`` (sync / checkpoint / anytime),
``steps``, ``lost_steps``, ``repeated_steps`` (steps with more than one record in the final history),
``retrained_steps`` (steps trained again after a trainer restart resumed from its checkpoint; their first
results were discarded with the restart), ``policy_version_monotonic``, ``restarts_by_role``, ``restarts``,
``recovery_seconds_p50``/``p95``, ``succeeded``, ``wall_seconds``, ``run_dir``.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

import yaml

import common

ROOT = common.ROOT
PID_LINE = re.compile(r"^(?P<name>\w+-\d+): pid (?P<pid>\d+) metrics on [\d.]+:(?P<port>\d+) \(attempt (?P<a>\d+)\)",
                      re.M)


def log(text: str) -> None:
    print(f"fault_campaign: {text}", file=sys.stderr, flush=True)


def current(run_dir: pathlib.Path) -> dict[str, dict[str, int]]:
    """name -> {pid, port} of each role's newest incarnation (from the role logs)."""
    out: dict[str, dict[str, int]] = {}
    for f in (run_dir / "logs").glob("*.log"):
        for m in PID_LINE.finditer(f.read_text(errors="replace")):
            out[m["name"]] = {"pid": int(m["pid"]), "port": int(m["port"])}
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def records(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def activity(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            return str(json.loads(r.read()).get("activity", ""))
    except Exception:  # noqa: BLE001 - not up (yet): no activity
        return ""


STEPS_PER_KILL = 10


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", nargs="?", help="the RLJob (local mode)")
    ap.add_argument("--kills", type=int, required=True, help="faults to deliver (cluster mode: of every kind)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--deadline", type=int, default=300, help="progressDeadlineSeconds of the campaign's policy "
                    "(cluster mode: seconds the whole campaign may take, default 3600)")
    ap.add_argument("--cluster", action="store_true", help="two real nodes (bench/fault_campaign_cluster.py)")
    ap.add_argument("--node-losses", type=int, default=0, help="cluster mode: how many of the faults are node losses")
    ap.add_argument("--partitions", type=int, default=0, help="cluster mode: how many are network partitions")
    ap.add_argument("--partition-seconds", type=float, default=30.0, help="cluster mode: each partition's length")
    ap.add_argument("--long-partitions", type=int, default=0,
                    help="cluster mode: how many are partitions longer than the node-loss grace (fencing)")
    ap.add_argument("--long-partition-seconds", type=float, default=None,
                    help="cluster mode: each long partition's length (default: the node controller's grace + the "
                    "operator's node-loss grace + 20 s)")
    ap.add_argument("--env-kills", type=int, default=0,
                    help="cluster mode: how many are environment-server kills (the multi-turn job is run)")
    args = ap.parse_args()
    if args.cluster:
        import fault_campaign_cluster

        return int(fault_campaign_cluster.main(
            faults=args.kills, node_losses=args.node_losses, partitions=args.partitions,
            partition_s=args.partition_seconds, seed=args.seed, run_dir=args.run_dir,
            deadline_s=3600.0 if args.deadline == 300 else float(args.deadline),
            long_partitions=args.long_partitions, long_partition_s=args.long_partition_seconds,
            env_kills=args.env_kills))
    if not args.file:
        ap.error("the RLJob file is required in local mode")
    rng = random.Random(args.seed)
    doc = yaml.safe_load(pathlib.Path(args.file).read_text())
    spec = doc["spec"]
    policy = {"maxRestarts": args.kills + 2, "progressDeadlineSeconds": args.deadline,
              "rules": [{"action": "RestartRole", "roles": ["generator", "verifier"]}]}
    spec["failurePolicy"] = policy
    steps = max(int(spec.get("algorithm", {}).get("steps", 1)), STEPS_PER_KILL * args.kills)
    spec.setdefault("algorithm", {})["steps"] = steps
    work = pathlib.Path(tempfile.mkdtemp(prefix="fault-campaign-"))
    run_dir = pathlib.Path(args.run_dir or work / "run").resolve()
    manifest = work / "rljob.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "kubeforge.cli", "run", str(manifest), "--run-dir", str(run_dir)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=open(work / "launcher.log", "wb"), text=True,
                            start_new_session=True)
    kills: list[dict[str, Any]] = []
    recovery: list[float] = []
    max_step, retrained = 0, 0

    def progress() -> int:
        nonlocal max_step, retrained
        recs = records(run_dir)
        last = recs[-1]["step"] if recs else 0
        if last < max_step:              # a trainer restart resumed from its checkpoint
            retrained += max_step - last
            max_step = last
        max_step = max(max_step, last)
        return last

    try:
        while len(kills) < args.kills and proc.poll() is None:
            procs = current(run_dir)
            if not procs or not records(run_dir):
                time.sleep(1)
                continue
            k = len(kills)
            moment = ("sync", "checkpoint", "anytime")[k % 3]
            role = "trainer" if moment != "anytime" and rng.random() < 0.5 else rng.choice(
                ["generator", "verifier", "trainer"])
            if moment == "anytime":
                time.sleep(rng.uniform(0.5, 4.0))
            else:
                port = procs.get("trainer-0", {}).get("port")
                until = time.monotonic() + 120
                while port and time.monotonic() < until and activity(port) != moment and proc.poll() is None:
                    time.sleep(0.01)
                if port and activity(port) != moment:
                    moment = "anytime"
            victims = [n for n in current(run_dir) if n.startswith(role)]
            name = rng.choice(sorted(victims))
            pid = current(run_dir)[name]["pid"]
            if not alive(pid):
                continue
            step_before = progress()
            os.kill(pid, signal.SIGKILL)
            t_kill = time.time()
            kills.append({"name": name, "role": role, "moment": moment, "step": step_before, "time": t_kill})
            log(f"kill {len(kills)}/{args.kills}: {name} (pid {pid}) during {moment} at step {step_before}")
            while proc.poll() is None:           # recovered: a step beyond the one before the kill
                if progress() > step_before:
                    recovery.append(time.time() - t_kill)
                    break
                time.sleep(0.2)
        out, _ = proc.communicate(timeout=3600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
    progress()
    summary = common.last_json(out) if out.strip() else {}
    recs = records(run_dir)
    seen = [r["step"] for r in recs]
    versions = [r.get("policy_version") for r in recs]
    q = statistics.quantiles(recovery, n=20) if len(recovery) >= 2 else recovery * 19
    reason = None
    if len(kills) < args.kills:
        reason = (f"the job ended (step {max_step} of {steps}) after {len(kills)} of {args.kills} kills"
                  if proc.returncode is not None else f"stopped after {len(kills)} of {args.kills} kills")
    result = {
        "mode": "local",
        "faultsRequested": args.kills, "faultsDelivered": len(kills), "faultsNotDeliveredReason": reason,
        "kills": len(kills),
        "kills_by_role": {r: sum(1 for k in kills if k["role"] == r) for r in ("generator", "verifier", "trainer")},
        "kills_during": {m: sum(1 for k in kills if k["moment"] == m) for m in ("sync", "checkpoint", "anytime")},
        "steps": len(set(seen)),
        "steps_wanted": steps,
        "lost_steps": len(set(range(1, steps + 1)) - set(seen)),
        "repeated_steps": len(seen) - len(set(seen)),
        "retrained_steps": retrained,
        "policy_version_monotonic": all(a is not None and b is not None and b > a
                                        for a, b in zip(versions, versions[1:])),
        "restarts": summary.get("restarts"),
        "restarts_by_role": summary.get("restarts_by_role"),
        "recovery_seconds_p50": round(statistics.median(recovery), 2) if recovery else None,
        "recovery_seconds_p95": round(q[18], 2) if recovery else None,
        "succeeded": summary.get("succeeded"),
        "failure_policy": policy,
        "wall_seconds": round(time.time() - started, 1),
        "run_dir": str(run_dir),
    }
    print(json.dumps(result), flush=True)
    ok = result["succeeded"] and not result["lost_steps"] and not result["repeated_steps"] and reason is None
    return 0 if ok and result["policy_version_monotonic"] else 1


if __name__ == "__main__":
    sys.exit(main())
