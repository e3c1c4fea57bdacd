"""Elastic generators in real pods: scale the tiny RLJob's generators 1 -> 2 -> 1 while it trains (`make e2e-elastic`).

```
 apply ──▶ Running (1 generator) ── trainer step >= 5 ──▶ kubectl scale rljob --replicas 2
      ──▶ gen-surplus-1 pod starts vLLM, says READY; trainer 0 grows the weight-sync group (epoch +1), pushes the
          current policy, hands it work ── 5 more steps ──▶ kubectl scale rljob --replicas 1
      ──▶ gen-surplus-1 pod deleted (SIGTERM: it tells trainer 0 it leaves; its work goes to generator-0)
      ──▶ Succeeded; the trainer pod's UID and restart count never changed
```

Uses the same cluster, operator and manifest as ``run_real`` (every role on the real node). Prints a measurement
line (``E2E-ELASTIC {...}``) and, on its LAST line, the RLJob's final ``status`` as JSON with ``trainerRestarts``
(trainer pod UID changes + container restarts), ``generatorsBefore`` and ``generatorsMax`` added; exits 0 only
when the job Succeeded at every step, with the trainer untouched and 2 generators reached.

``--scenarios restart-role,fail-rule,max-restarts`` runs the failure-policy cases in real pods instead (run by
hand, one cluster, a fresh namespace each; each prints ``E2E-SCENARIO {...}``, the last line is a JSON object of
every scenario's verdict):
- ``restart-role``: rule RestartRole for generators; generator-0's process is kill -9ed at step 2 (of 15); the operator is
  SIGKILLed (and started again) twice while the restart is in flight: right after the kill (before it can have
  written the failure) and once the status counts the restart (before the generator is back). Wanted: Succeeded,
  every step once, the trainer pod's UID and restart count unchanged, one generator pod (restarted in place),
  ``restarts`` = ``roles.generator.restarts`` = 1, attempt 0, never more pods than replicas.
- ``fail-rule``: rule Fail on exit code 137 for generators; the kill fails the job with ``FailedByRule``.
- ``max-restarts``: RestartRole with ``maxRestarts: 0``; the kill fails the job with ``BackoffLimitExceeded``.

The operator runs as a host process (``harness.Operator``), not the chart's pod, because ``restart-role`` SIGKILLs
it at chosen moments and starts it again at once, which a Deployment's pod restarted by the kubelet (with back-off)
cannot be timed to.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import tempfile
import time
import uuid
from typing import Any

_E2E = pathlib.Path(__file__).resolve().parent
if str(_E2E) not in sys.path:
    sys.path.insert(0, str(_E2E))

import run_real  # noqa: E402
from run_real import harness, lifecycle, log, realjob  # noqa: E402

UP_AT_STEP = 3           # scale up once the trainer reported this step
STEPS = 300              # long enough that a second vLLM engine (about a minute to start) joins a running job
STEPS_WITH_TWO = 5       # steps trained with both generators before scaling down


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions") or [])


def run(*, cluster: lifecycle.Cluster, workdir: pathlib.Path, name: str = "tiny", timeout_s: float = 1800.0
        ) -> tuple[dict[str, Any], dict[str, Any]]:
    k = cluster.kubectl
    harness.K(kubectl=k.binary, kubeconfig=k.kubeconfig).ensure_crd()
    ns = f"e2e-elastic-{uuid.uuid4().hex[:6]}"
    k.run("create", "namespace", ns)
    checkpoints = workdir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    checkpoints.chmod(0o777)    # a hostPath: the pods run as a non-root UID (render/security.py), fsGroup skips it
    op = harness.Operator(kubeconfig=k.kubeconfig, log_path=workdir / "operator.log", extra=("--namespace", ns))
    op.start()
    figures: dict[str, Any] = {"scaled": []}
    trainer_uids: set[str] = set()
    trainer_restarts = 0
    generators_before, generators_max = None, 0
    try:
        job = realjob.manifest(name=name, namespace=ns, checkpoint_dir=checkpoints, steps=STEPS)
        job["spec"]["roles"]["generator"]["replicas"] = 1
        job["spec"]["roles"]["generator"]["minReplicas"] = 1      # the gang holds one; more join when they fit
        r = run_real.Run(k=k, namespace=ns, name=name, workdir=workdir, kill_after_step=None, timeout_s=timeout_s)
        steps = int(job["spec"]["algorithm"]["steps"])
        t0 = time.monotonic()
        k.apply(job)
        log(f"applied RLJob {ns}/{name} ({steps} steps, 1 generator)")
        stage, up_step, status = "wait-up", 0, {}
        while time.monotonic() - t0 < timeout_s:
            status = r.get_job().get("status") or {}
            pods = r.get_pods()
            r.follow_new_containers(pods)
            for p in pods:
                md = p["metadata"]
                if md["name"] == f"{name}-trainer-0" and not md.get("deletionTimestamp"):
                    trainer_uids.add(md["uid"])
                    trainer_restarts = max(trainer_restarts, sum(int(c.get("restartCount", 0)) for c in
                                                                 p.get("status", {}).get("containerStatuses") or []))
            gens = [p for p in pods if p["metadata"]["labels"].get(run_real.LABEL_ROLE) == "generator"
                    and not p["metadata"].get("deletionTimestamp")]
            ready_gens = sum(_ready(p) for p in gens)
            generators_max = max(generators_max, ready_gens)
            step = r.trainer_step(pods)
            phase = status.get("phase")
            if stage == "wait-up" and phase == "Running" and step >= UP_AT_STEP:
                generators_before = ready_gens
                k.run("scale", "rljob", name, "-n", ns, "--replicas=2")
                figures["scaled"].append({"to": 2, "at_step": step, "t": round(time.monotonic() - t0, 1)})
                log(f"scaled generators to 2 at step {step}")
                stage, t_up = "wait-two", time.monotonic()
            elif stage == "wait-two" and ready_gens == 2:
                figures["second_generator_ready_s"] = round(time.monotonic() - t_up, 1)
                stage, up_step = "train-two", step
                log(f"2 generators ready at step {step}")
            elif stage == "train-two" and step >= up_step + STEPS_WITH_TWO:
                k.run("scale", "rljob", name, "-n", ns, "--replicas=1")
                figures["scaled"].append({"to": 1, "at_step": step, "t": round(time.monotonic() - t0, 1)})
                log(f"scaled generators to 1 at step {step}")
                stage = "done-scaling"
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        figures["apply_to_end_s"] = round(time.monotonic() - t0, 1)
        figures["stage"] = stage
        for key, f in r.followers.items():
            text = f.finish()
            if key.startswith("trainer:"):
                _, seq = run_real.step_sequence(text)
                figures.setdefault("trainer_steps", []).append(seq)
                figures["membership"] = [line for line in text.splitlines() if "generators " in line and "->" in line]
        status = dict(status)
        status["trainerRestarts"] = trainer_restarts + max(0, len(trainer_uids) - 1)
        status["generatorsBefore"] = generators_before
        status["generatorsMax"] = generators_max
        figures["steps"] = steps
        return figures, status
    finally:
        op.stop()
        k.run("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout_s=150)


SCENARIOS: dict[str, dict[str, Any]] = {
    "restart-role": {"steps": 15, "kill_at_step": 2, "want": "Succeeded", "kill_operator": True,
                     "failurePolicy": {"maxRestarts": 3, "rules": [{"action": "RestartRole", "roles": ["generator"]}]}},
    "fail-rule": {"steps": 300, "kill_at_step": 1, "want": "Failed", "reason": "FailedByRule",
                  "failurePolicy": {"maxRestarts": 3, "rules": [
                      {"action": "Fail", "roles": ["generator"], "onExitCodes": [137]},
                      {"action": "RestartRole", "roles": ["generator"]}]}},
    "max-restarts": {"steps": 300, "kill_at_step": 1, "want": "Failed", "reason": "BackoffLimitExceeded",
                     "failurePolicy": {"maxRestarts": 0, "rules": [{"action": "RestartRole", "roles": ["generator"]}]}},
}


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def scenario(*, cluster: lifecycle.Cluster, workdir: pathlib.Path, which: str, name: str = "tiny",
             timeout_s: float = 900.0) -> dict[str, Any]:
    """One failure-policy case in real pods (see the module docstring); returns its figures and ``ok``."""
    sc = SCENARIOS[which]
    k = cluster.kubectl
    harness.K(kubectl=k.binary, kubeconfig=k.kubeconfig).ensure_crd()
    ns = f"e2e-{which}-{uuid.uuid4().hex[:6]}"
    k.run("create", "namespace", ns)
    checkpoints = workdir / which / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    checkpoints.chmod(0o777)
    op = harness.Operator(kubeconfig=k.kubeconfig, log_path=workdir / f"operator-{which}.log", extra=("--namespace", ns))
    op.start()
    out: dict[str, Any] = {"scenario": which, "operator_kills": []}
    trainer_uids: set[str] = set()
    generator_uids: set[str] = set()
    trainer_restarts, max_pods, attempts = 0, 0, set()
    try:
        job = realjob.manifest(name=name, namespace=ns, checkpoint_dir=checkpoints, steps=int(sc["steps"]))
        job["spec"]["failurePolicy"] = sc["failurePolicy"]
        replicas = sum(int(job["spec"]["roles"][r].get("replicas", 1)) for r in ("trainer", "generator", "verifier"))
        r = run_real.Run(k=k, namespace=ns, name=name, workdir=workdir / which, kill_after_step=None,
                         timeout_s=timeout_s)
        t0 = time.monotonic()
        k.apply(job)
        log(f"[{which}] applied RLJob {ns}/{name} ({sc['steps']} steps, failurePolicy {sc['failurePolicy']})")
        stage, status, t_kill = "wait-kill", {}, 0.0
        while time.monotonic() - t0 < timeout_s:
            status = r.get_job().get("status") or {}
            pods = r.get_pods()
            r.follow_new_containers(pods)
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            max_pods = max(max_pods, len(live))
            for p in pods:
                md = p["metadata"]
                attempts.add(md.get("labels", {}).get(run_real.LABEL_ATTEMPT))
                restarts = sum(int(c.get("restartCount", 0)) for c in p.get("status", {}).get("containerStatuses") or [])
                if md["name"] == f"{name}-trainer-0":
                    trainer_uids.add(md["uid"])
                    trainer_restarts = max(trainer_restarts, restarts)
                if md["name"] == f"{name}-generator-0":
                    generator_uids.add(md["uid"])
            step, phase = r.trainer_step(pods), status.get("phase")
            if stage == "wait-kill" and phase == "Running" and step >= int(sc["kill_at_step"]):
                k.run("exec", "-n", ns, f"{name}-generator-0", "-c", "generator", "--", "sh", "-c",
                      f"kill -9 $(cat {realjob.ROLE_PID_FILE})")
                t_kill = time.monotonic()
                out["killed"] = {"pod": f"{name}-generator-0", "signal": "SIGKILL", "at_step": step}
                log(f"[{which}] kill -9 generator-0 at step {step}")
                stage = "killed"
                if sc.get("kill_operator"):
                    op.kill()                 # right after the kill: the failure is not yet (or just) handled
                    seen = r.get_job().get("status") or {}
                    out["operator_kills"].append({"when": "right after the generator kill",
                                                  "restarts_in_status": seen.get("restarts", 0),
                                                  "lastFailure_in_status": bool(seen.get("lastFailure"))})
                    time.sleep(2.0)
                    op.start()
                    stage = "op-killed-once"
            elif (stage == "op-killed-once" and int(status.get("restarts", 0)) >= 1
                  and int(((status.get("roles") or {}).get("generator") or {}).get("ready", 0) or 0) == 0):
                op.kill()                     # the restart is counted, the generator is not back yet
                out["operator_kills"].append({"when": "restart counted, generator not ready",
                                              "restarts_in_status": status.get("restarts", 0)})
                time.sleep(2.0)
                op.start()
                stage = "op-killed-twice"
            if phase in ("Succeeded", "Failed"):
                break
            time.sleep(0.5)
        out["kill_to_end_s"] = round(time.monotonic() - t_kill, 1) if t_kill else None
        out["apply_to_end_s"] = round(time.monotonic() - t0, 1)
        out["stage"] = stage
        for key, f in r.followers.items():
            text = f.finish()
            if key.startswith("trainer:"):
                _, seq = run_real.step_sequence(text)
                out.setdefault("trainer_steps", []).append(seq)
        failed = _condition(status, "Failed")
        out["status"] = {key: status.get(key) for key in ("phase", "attempt", "restarts", "progress", "lastFailure")}
        out["status"]["generatorRestarts"] = ((status.get("roles") or {}).get("generator") or {}).get("restarts")
        out["status"]["failedReason"] = failed.get("reason")
        out["trainerRestarts"] = trainer_restarts + max(0, len(trainer_uids) - 1)
        out["trainerPods"], out["generatorPods"] = len(trainer_uids), len(generator_uids)
        out["maxPods"], out["replicas"], out["attempts"] = max_pods, replicas, sorted(a for a in attempts if a)
        # the verdict counts only when the test's own kill caused it (a liveness kill during a slow vLLM start once
        # failed a fail-rule job with the same exit code before the kill)
        ok = ("killed" in out and status.get("phase") == sc["want"] and max_pods <= replicas
              and out["trainerRestarts"] == 0)
        if sc["want"] == "Succeeded":
            seqs = out.get("trainer_steps") or [[]]
            ok = ok and (status.get("progress") or {}).get("step") == sc["steps"] and len(seqs) == 1 \
                and seqs[0] == list(range(1, int(sc["steps"]) + 1)) and status.get("restarts") == 1 \
                and out["status"]["generatorRestarts"] == 1 and status.get("attempt", 0) == 0 \
                and len(generator_uids) == 1 and len(trainer_uids) == 1
        else:
            ok = ok and failed.get("reason") == sc["reason"]
        out["ok"] = bool(ok)
        return out
    finally:
        op.stop()
        k.run("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout_s=150)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="run_elastic", description=__doc__.split("\n")[0])
    p.add_argument("--workdir")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--scenarios", help=f"comma-separated, of {sorted(SCENARIOS)}: failure-policy cases instead of "
                                       "the scaling run")
    args = p.parse_args(argv)
    if args.scenarios:
        return _scenarios([s.strip() for s in args.scenarios.split(",") if s.strip()], args.workdir)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    got = run_real.acquire_cluster(start=True)
    if isinstance(got, str):
        log(got)
        return 2
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="kf-e2e-elastic-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        figures, status = run(cluster=got.cluster, workdir=workdir, timeout_s=args.timeout)
    finally:
        if got.started and os.environ.get("KF_KEEP_CLUSTER") != "1":
            lifecycle.down(workdir=got.cluster.workdir)
    print("E2E-ELASTIC " + json.dumps({**figures, "workdir": str(workdir)}), flush=True)
    print(json.dumps(status), flush=True)
    steps = figures.get("trainer_steps") or [[]]
    ok = (status.get("phase") == "Succeeded" and (status.get("progress") or {}).get("step") == figures["steps"]
          and status["trainerRestarts"] == 0 and status["generatorsMax"] == 2
          and steps[-1] == list(range(1, figures["steps"] + 1)))
    return 0 if ok else 1


def _scenarios(names: list[str], workdir_arg: str | None) -> int:
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        log(f"unknown scenarios {unknown}; known: {sorted(SCENARIOS)}")
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    got = run_real.acquire_cluster(start=True)
    if isinstance(got, str):
        log(got)
        return 2
    workdir = pathlib.Path(workdir_arg or tempfile.mkdtemp(prefix="kf-e2e-scenarios-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    verdicts: dict[str, Any] = {}
    try:
        for n in names:
            t = time.monotonic()
            try:
                res = scenario(cluster=got.cluster, workdir=workdir, which=n)
            except Exception as exc:  # noqa: BLE001 - reported as that scenario's verdict, the others still run
                res = {"scenario": n, "ok": False, "error": repr(exc)}
            res["wall_s"] = round(time.monotonic() - t, 1)
            print("E2E-SCENARIO " + json.dumps(res), flush=True)
            verdicts[n] = {key: res.get(key) for key in ("ok", "status", "trainerRestarts", "wall_s")}
    finally:
        if got.started and os.environ.get("KF_KEEP_CLUSTER") != "1":
            lifecycle.down(workdir=got.cluster.workdir)
    print(json.dumps(verdicts), flush=True)
    return 0 if all(v["ok"] for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
