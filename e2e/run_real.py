"""The tiny RLJob in real pods, run by the operator to Succeeded, with one trainer crash on the way.

Role: the driver shared by ``make e2e-real`` (``python e2e/run_real.py``) and ``e2e/test_e2e_real.py``. It
uses (or starts) a test cluster with the real node, installs the operator as users do (``installed``: ``helm
install`` of the chart with this checkout's operator image, in a pod on the real node, under the chart's RBAC; namespaced
mode over the job's namespace by default, cluster-wide mode when asked), applies the manifest of
``realjob.manifest`` (every role on the real node, the project's venv from the host), and watches:

```
 apply ──▶ Starting ──▶ Running ── trainer step >= kill_after ──▶ kubectl exec: kill -<SIG> <role process>
             (vLLM starts in the generator pod)       │ container exits 128+SIG; the kubelet restarts it
                                                      ▼
          status.lastFailure {role, exitCode}, status.restarts ──▶ Restarting (attempt 1) ──▶ Running
                                                      ──▶ trainer resumes from its hostPath checkpoint ──▶ Succeeded
```

While it runs it follows each trainer pod's container log (``kubectl logs -f``; trainer 0 prints one JSON record
per step, ``{"resumed": s}`` first; every trainer pod's log lands in the workdir), prints the last log lines of any
container that exits non-zero (once per container, also in the ``E2E-REAL`` line's ``failures``) and samples the RSS of every pod's processes from the host (``/proc``, by the
pod's cgroup). The command prints a measurement line (``E2E-REAL {...}``) and then, on its LAST line, the
RLJob's final ``status`` as JSON; it exits 0 only when that status is Succeeded at ``spec.algorithm.steps``.

Neighbours: ``kfcluster`` (cluster), ``node.realnode`` (node status), ``installed`` (the chart-installed
operator), ``realjob`` (manifest). Never connects to a pod: only kubectl and the host's /proc.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

_E2E = pathlib.Path(__file__).resolve().parent
ROOT = _E2E.parent
if str(_E2E) not in sys.path:
    sys.path.insert(0, str(_E2E))

import installed  # noqa: E402
import realjob  # noqa: E402
from kfcluster import config as cfg  # noqa: E402
from kfcluster import harness  # noqa: E402
from kfcluster import kube, lifecycle  # noqa: E402
from node import realnode  # noqa: E402

LABEL_JOB = "kubeforge.dev/job"
LABEL_ROLE = "kubeforge.dev/role"
LABEL_ATTEMPT = "kubeforge.dev/attempt"
KILL_SIGNAL = signal.SIGUSR1        # Python's default action for it is to terminate: exit code 128 + 10


def log(msg: str) -> None:
    print(f"[e2e-real {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------- the cluster


@dataclasses.dataclass(frozen=True, kw_only=True)
class Acquired:
    cluster: lifecycle.Cluster
    started: bool                  # this process started it (and should stop it)
    setup_seconds: float | None    # cluster-up with the real node, when started here


def acquire_cluster(*, start: bool) -> Acquired | str:
    """The cluster ``kfcluster.config.from_env()`` names, with its real node Ready; started when absent and
    ``start``. Returns a reason (str) when it cannot be used."""
    base = cfg.from_env()
    running = lifecycle.healthy(base.workdir)
    if running is not None:
        state = realnode.status(running.kubectl)
        return Acquired(cluster=running, started=False, setup_seconds=None) if state.up else (
            f"cluster {base.name} runs without a usable real node ({state.reason}); stop it or pick another "
            "KF_CLUSTER_NAME")
    if not start:
        return f"no cluster {base.name} running (start one with `make cluster-up REAL_NODE=1`)"
    log(f"starting cluster {base.name} with the real node")
    os.environ.setdefault("KF_REAL_NODE_WAIT_S", "600")   # one real node per machine: wait for another's to stop
    t0 = time.monotonic()
    cluster = lifecycle.up(lifecycle.with_real_node_settings(cfg.from_env(real_node=True)))
    seconds = time.monotonic() - t0
    state = realnode.status(cluster.kubectl)
    if not state.up:
        return f"cluster {base.name} started but its real node is not usable: {state.reason}"
    log(f"cluster with real node up in {seconds:.1f}s")
    return Acquired(cluster=cluster, started=True, setup_seconds=seconds)


# ------------------------------------------------------------------------------------------- observing


class LogFollower:
    """``kubectl logs -f`` of one container instance into a file; ends when that container exits."""

    def __init__(self, *, k: kube.Kubectl, namespace: str, pod: str, container: str, path: pathlib.Path) -> None:
        self.path = path
        self._out = open(path, "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [k.binary, f"--kubeconfig={k.kubeconfig}", "logs", "-f", "-n", namespace, pod, "-c", container],
            stdout=self._out, stderr=subprocess.STDOUT)

    def finish(self, *, timeout_s: float = 30.0) -> str:
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            self.proc.wait(10)
        self._out.close()
        return self.path.read_text(errors="replace")


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects among a log's lines (the trainer's step records and resume markers)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
    return out


def step_sequence(text: str) -> tuple[int | None, list[int]]:
    """(resumed-from step or None, steps in the order the trainer reported them) of one trainer log."""
    docs = json_lines(text)
    resumed = next((d["resumed"] for d in docs if isinstance(d.get("resumed"), int)), None)
    steps = [d["step"] for d in docs if isinstance(d.get("step"), int) and "mean_reward" in d and "done" not in d]
    return resumed, steps


#: Trainer 0's word that a generator came back and holds the current policy (trainer.membership: a restart or a join)
REJOINED = re.compile(r"^trainer-0: (generator-\d+ restarted:|generators .*\(joined\))", re.M)


def stepped_after_fault(text: str, *, since: int, restarted: bool) -> bool:
    """Has trainer 0 trained a step of the recovery? ``text``: its log; ``since``: how much of it there was at the
    fault. A trainer started after the fault (``restarted``): any step record. One that kept running (a
    ``RestartRole`` of the generators): a step record after its push to a generator that came back, so a step
    trained from rollouts sampled before the fault does not count."""
    tail = text[since:]
    if not restarted:
        came_back = REJOINED.search(tail)
        if came_back is None:
            return False
        tail = tail[came_back.end():]
    return bool(step_sequence(tail)[1])


def _pod_pids(uid: str) -> list[int]:
    """Host PIDs of the processes in the pod with ``uid`` (its cgroup path names ``pod<uid>``)."""
    needles = (f"pod{uid}", f"pod{uid.replace('-', '_')}")
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            text = pathlib.Path(entry.path, "cgroup").read_text()
        except OSError:
            continue
        if any(n in text for n in needles):
            pids.append(int(entry.name))
    return pids


def _rss_kib(pid: int) -> int:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssSampler:
    """Peak of the summed RSS of each role's pod processes (per attempt), sampled from the host every 2 s."""

    def __init__(self) -> None:
        self.pods: dict[str, str] = {}          # uid -> "role/attempt"
        self.peak_kib: dict[str, int] = {}
        self.peak_total_kib = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def watch(self, pods: list[dict[str, Any]]) -> None:
        with self._lock:
            for p in pods:
                labels = p["metadata"].get("labels", {})
                self.pods[p["metadata"]["uid"]] = f"{labels.get(LABEL_ROLE)}/{labels.get(LABEL_ATTEMPT)}"

    def _loop(self) -> None:
        while not self._stop.wait(2.0):
            with self._lock:
                pods = dict(self.pods)
            total = 0
            for uid, key in pods.items():
                kib = sum(_rss_kib(pid) for pid in _pod_pids(uid))
                total += kib
                if kib > self.peak_kib.get(key, 0):
                    self.peak_kib[key] = kib
            self.peak_total_kib = max(self.peak_total_kib, total)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(10)
        per_role: dict[str, int] = {}
        for key, kib in self.peak_kib.items():
            role = key.split("/")[0]
            per_role[role] = max(per_role.get(role, 0), kib)
        return {"peak_pod_rss_mib": {r: round(v / 1024) for r, v in sorted(per_role.items())},
                "peak_all_pods_rss_mib": round(self.peak_total_kib / 1024)}


# ------------------------------------------------------------------------------------------- the run


@dataclasses.dataclass(kw_only=True)
class Result:
    status: dict[str, Any]
    steps: int
    apply_to_running_s: float | None = None
    apply_to_succeeded_s: float | None = None
    restart_to_running_s: float | None = None
    failure_status: dict[str, Any] | None = None      # the status right after the kill showed in it
    killed: dict[str, Any] | None = None              # role, pod, signal, exit code, trainer step at the kill
    trainer_logs: list[str] = dataclasses.field(default_factory=list)   # one per trainer-0 container followed
    generator_logs: list[str] = dataclasses.field(default_factory=list)
    rank_logs: dict[str, list[str]] = dataclasses.field(default_factory=dict)   # other trainer pods: pod -> logs
    verifier_logs: dict[str, list[str]] = dataclasses.field(default_factory=dict)   # verifier pods: pod -> logs
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)    # containers that exited non-zero
    pods: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # every pod seen (last object)
    memory: dict[str, Any] = dataclasses.field(default_factory=dict)
    checkpoints: list[str] = dataclasses.field(default_factory=list)
    phases: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    export: dict[str, Any] | None = None              # the export asked for on the RLJob, once status served it
    operator: dict[str, Any] = dataclasses.field(default_factory=dict)   # the release it ran under (installed.summary)
    api_requests: dict[str, float] = dataclasses.field(default_factory=dict)  # "verb resource" -> the operator's count
    undeclared: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # of those, beyond access.NEEDS
    failure_seen_s: float | None = None               # fault -> the failure in status.lastFailure
    next_step_s: float | None = None                  # fault -> trainer 0's first step of the recovery (stepped_after_fault)

    @property
    def succeeded(self) -> bool:
        return self.status.get("phase") == "Succeeded" and (self.status.get("progress") or {}).get("step") == self.steps

    def figures(self) -> dict[str, Any]:
        """The measured numbers (docs/e2e-real.md)."""
        rewards = [d["mean_reward"] for t in self.trainer_logs for d in json_lines(t)
                   if "mean_reward" in d and isinstance(d.get("step"), int)]
        return {"apply_to_running_s": _r(self.apply_to_running_s), "apply_to_succeeded_s": _r(self.apply_to_succeeded_s),
                "restart_to_running_s": _r(self.restart_to_running_s), "steps": self.steps,
                "progress": self.status.get("progress"), "killed": self.killed,
                "reward_first_step": rewards[0] if rewards else None,
                "reward_last_step": rewards[-1] if rewards else None,
                "reward_gain": round(rewards[-1] - rewards[0], 4) if rewards else None, **self.memory,
                "failures": [{k: v for k, v in f.items() if k != "log_tail"} for f in self.failures],
                "export": self.export, "env_servers": self.env_servers(), "operator": self.operator,
                "phases": [(round(t, 1), p) for t, p in self.phases]}

    def env_servers(self) -> dict[str, str]:
        """Each verifier pod's environment-server summary line (multi-turn jobs: where the environments ran)."""
        return {pod: line.split(": ", 1)[1] for pod, texts in self.verifier_logs.items() for text in texts
                for line in text.splitlines() if ": environment server: " in line}


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


class Run:
    """One RLJob from apply to a terminal phase, with an optional trainer kill (state of the watch loop)."""

    def __init__(self, *, k: kube.Kubectl, namespace: str, name: str, workdir: pathlib.Path,
                 kill_after_step: int | None, timeout_s: float, export_after_step: int | None = None,
                 fault: Callable[[int, list[dict[str, Any]]], dict[str, Any]] | None = None) -> None:
        self.k, self.ns, self.name, self.workdir = k, namespace, name, workdir
        self.fault = fault              # instead of the trainer kill: (step, pods) -> what was done
        self.kill_after_step, self.timeout_s = kill_after_step, timeout_s
        self.export_after_step = export_after_step
        self.export_request: tuple[str, float, int] | None = None    # (id, when asked, trainer step then)
        self.followers: dict[str, LogFollower] = {}     # "<role>:<pod uid>" -> follower
        self.sampler = RssSampler()
        self.seen: dict[str, dict[str, Any]] = {}
        self.reported: set[str] = set()                 # containers whose failure was printed
        self.failures: list[dict[str, Any]] = []

    def get_job(self) -> dict[str, Any]:
        return self.k.get_json("rljob", self.name, "-n", self.ns)  # type: ignore[no-any-return]

    def get_pods(self) -> list[dict[str, Any]]:
        return self.k.get_json("pods", "-n", self.ns, "-l", f"{LABEL_JOB}={self.name}")["items"]  # type: ignore[no-any-return]

    def follow_new_containers(self, pods: list[dict[str, Any]]) -> None:
        """Start following every trainer pod's and generator-0's container that runs and is not followed yet
        (keys: ``trainer:<uid>`` for trainer 0, ``rank:<pod>:<uid>`` for the other trainer pods)."""
        for p in pods:
            md = p["metadata"]
            role = md.get("labels", {}).get(LABEL_ROLE)
            first = md["name"] in (f"{self.name}-trainer-0", f"{self.name}-generator-0")
            if not (first or role in ("trainer", "verifier")) or md.get("deletionTimestamp"):
                continue
            key = (f"{role}:{md['uid']}" if first else f"verifier:{md['name']}:{md['uid']}" if role == "verifier"
                   else f"rank:{md['name']}:{md['uid']}")
            running = any("running" in (cs.get("state") or {}) for cs in p.get("status", {}).get("containerStatuses") or [])
            if key not in self.followers and running:
                stem = role if first else md["name"].removeprefix(f"{self.name}-")
                path = self.workdir / f"{stem}-{md['labels'].get(LABEL_ATTEMPT)}-{md['uid'][:8]}.log"
                self.followers[key] = LogFollower(k=self.k, namespace=self.ns, pod=md["name"], container=role,
                                                  path=path)

    def report_failures(self, pods: list[dict[str, Any]], *, lines: int = 40) -> None:
        """Print the last ``lines`` log lines of every container that exited non-zero, once per container (not the
        SIGTERM exit, 143, of a pod being deleted: the operator scaling a finished or restarting job down)."""
        for p in pods:
            md = p["metadata"]
            for cs in p.get("status", {}).get("containerStatuses") or []:
                for previous, state in ((False, cs.get("state") or {}), (True, cs.get("lastState") or {})):
                    term = state.get("terminated") or {}
                    cid = term.get("containerID") or f"{md['uid']}/{term.get('finishedAt')}"
                    stopped = md.get("deletionTimestamp") and term.get("exitCode") == 143   # SIGTERM of a pod being deleted
                    if not term or term.get("exitCode") in (0, None) or stopped or cid in self.reported:
                        continue
                    self.reported.add(cid)
                    args = ["logs", "-n", self.ns, md["name"], "-c", cs["name"], f"--tail={lines}"]
                    got = self.k.run(*args, *(["--previous"] if previous else []), check=False, timeout_s=30)
                    text = (got.stdout or got.stderr or "").rstrip()
                    failure = {"pod": md["name"], "attempt": md.get("labels", {}).get(LABEL_ATTEMPT),
                               "exit_code": term.get("exitCode"), "reason": term.get("reason"), "log_tail": text}
                    self.failures.append(failure)
                    log(f"{md['name']} (attempt {failure['attempt']}) exited {term.get('exitCode')}; its last "
                        f"{lines} log lines:\n" + "\n".join(f"    | {line}" for line in text.splitlines()))

    def trainer_step(self, pods: list[dict[str, Any]]) -> int:
        """Step in trainer rank 0's progress annotation (what the operator reads), 0 when none."""
        for p in pods:
            if p["metadata"]["name"] == f"{self.name}-trainer-0" and not p["metadata"].get("deletionTimestamp"):
                ann = (p["metadata"].get("annotations") or {}).get("kubeforge.dev/progress")
                if ann:
                    return int(json.loads(ann).get("step", 0))
        return 0

    def progress_step(self, status: dict[str, Any], pods: list[dict[str, Any]]) -> int:
        """The furthest step seen of the current trainer 0: its step records (the log being followed), its progress
        annotation, ``status.progress.step``; before any fault all three count the first attempt's steps."""
        logged = [step_sequence(f.path.read_text(errors="replace"))[1] for key, f in self.followers.items()
                  if key.startswith("trainer:")]
        return max([self.trainer_step(pods), int((status.get("progress") or {}).get("step") or 0),
                    *(max(s) for s in logged if s)])

    def ask_for_export(self, status: dict[str, Any], pods: list[dict[str, Any]], result: Result) -> None:
        """Once trainer 0 reached ``export_after_step``: annotate the RLJob with an export request (as a user
        would), then record ``status.progress.lastExport`` when it names that request."""
        if self.export_after_step is None or result.export is not None:
            return
        if self.export_request is None:
            if status.get("phase") == "Running" and (step := self.trainer_step(pods)) >= self.export_after_step:
                rid = f"e2e-{uuid.uuid4().hex[:8]}"
                self.k.run("annotate", "rljob", self.name, "-n", self.ns, f"kubeforge.dev/export-request={rid}",
                           "--overwrite")
                self.export_request = (rid, time.monotonic(), step)
                log(f"asked for export {rid} at step {step}")
            return
        rid, asked, step = self.export_request
        last = (status.get("progress") or {}).get("lastExport") or {}
        if last.get("request") == rid:
            result.export = {**last, "asked_at_step": step, "seconds": round(time.monotonic() - asked, 1)}
            log(f"export {rid} served: {result.export}")

    def kill_trainer(self, *, step: int) -> dict[str, Any]:
        """Kill the trainer process (the child of the container's PID 1) with ``KILL_SIGNAL``."""
        pod = f"{self.name}-trainer-0"
        self.k.run("exec", "-n", self.ns, pod, "-c", "trainer", "--", "sh", "-c",
                   f"kill -{int(KILL_SIGNAL)} $(cat {realjob.ROLE_PID_FILE})")
        killed = {"role": "trainer", "pod": pod, "signal": KILL_SIGNAL.name, "exit_code": 128 + int(KILL_SIGNAL),
                  "at_step": step}
        log(f"killed {pod} at step {step}: {killed}")
        return killed

    def execute(self, job: dict[str, Any]) -> Result:
        steps = int(job["spec"]["algorithm"]["steps"])
        result = Result(status={}, steps=steps)
        self.sampler.start()
        t0 = time.monotonic()
        self.k.apply(job)
        log(f"applied RLJob {self.ns}/{self.name} ({steps} steps)")
        deadline, last_phase, t_kill = t0 + self.timeout_s, None, None
        at_fault: dict[str, int] = {}           # trainer follower -> the length of its log at the fault
        try:
            while time.monotonic() < deadline:
                status = self.get_job().get("status") or {}
                pods = self.get_pods()
                self.sampler.watch(pods)
                for p in pods:
                    self.seen[p["metadata"]["uid"]] = p
                self.follow_new_containers(pods)
                self.report_failures(pods)
                now, phase = time.monotonic() - t0, status.get("phase")
                if phase != last_phase:
                    log(f"phase {phase} at {now:.1f}s (progress {status.get('progress')})")
                    result.phases.append((now, str(phase)))
                    last_phase = phase
                if phase == "Running" and result.apply_to_running_s is None:
                    result.apply_to_running_s = now
                if phase == "Running" and t_kill is not None and result.restart_to_running_s is None \
                        and status.get("attempt", 0) >= 1:
                    result.restart_to_running_s = time.monotonic() - t_kill
                # On training progress, not on the phase: a short job can train every step between two polls of
                # a phase that reads Starting (a role's readiness probe lagging behind its first steps), and then
                # never reads Running (seen: Starting -> Succeeded in 122 s, 14 steps in 6 s, the fault unfired).
                if (self.kill_after_step is not None and result.killed is None and phase not in ("Succeeded", "Failed")
                        and (step := self.progress_step(status, pods)) >= self.kill_after_step):
                    result.killed = self.fault(step, pods) if self.fault else self.kill_trainer(step=step)
                    t_kill = time.monotonic()
                    at_fault = {key: len(f.path.read_text(errors="replace")) for key, f in self.followers.items()
                                if key.startswith("trainer:")}
                self.ask_for_export(status, pods, result)
                if t_kill is not None and result.next_step_s is None and any(
                        stepped_after_fault(f.path.read_text(errors="replace"), since=at_fault.get(key, 0),
                                            restarted=key not in at_fault)
                        for key, f in self.followers.items() if key.startswith("trainer:")):
                    result.next_step_s = time.monotonic() - t_kill
                    log(f"first step after the fault trained {result.next_step_s:.1f}s after it")
                if result.killed is not None and result.failure_status is None and status.get("lastFailure"):
                    result.failure_status = status
                    result.failure_seen_s = time.monotonic() - t_kill if t_kill is not None else None
                    log(f"failure in status: lastFailure={status['lastFailure']} restarts={status.get('restarts')}")
                if phase in ("Succeeded", "Failed"):
                    result.apply_to_succeeded_s = now if phase == "Succeeded" else None
                    result.status = status
                    break
                time.sleep(0.5)
            else:
                result.status = self.get_job().get("status") or {}
                log(f"timed out after {self.timeout_s:.0f}s in phase {result.status.get('phase')}")
        finally:
            result.memory = self.sampler.stop()
            for key, f in self.followers.items():
                text = f.finish()
                if key.startswith("rank:"):
                    result.rank_logs.setdefault(key.split(":")[1], []).append(text)
                elif key.startswith("verifier:"):
                    result.verifier_logs.setdefault(key.split(":")[1], []).append(text)
                else:
                    (result.trainer_logs if key.startswith("trainer:") else result.generator_logs).append(text)
            result.pods = list(self.seen.values())
            result.failures = list(self.failures)
        return result


def run(*, cluster: lifecycle.Cluster, workdir: pathlib.Path, name: str | None = None,
        kill_after_step: int | None = 8, timeout_s: float = 1200.0, keep_namespace: bool = False,
        base: pathlib.Path | None = None, export_after_step: int | None = None,
        fault: Callable[[int, list[dict[str, Any]]], dict[str, Any]] | None = None,
        chart_values: tuple[str, ...] = (), prepare: Callable[[str], None] | None = None,
        mode: str = installed.NAMESPACED, runtime_image: str | None = None,
        adapt: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> Result:
    """Run the RLJob of ``base`` (default: examples/tiny.yaml) in real pods on ``cluster`` (whose real node is up);
    artefacts under ``workdir``. ``name`` defaults to the manifest's own; ``prepare(namespace)`` runs once the
    namespace exists, before the RLJob is applied (e.g. a Kueue LocalQueue in it); ``adapt(job)`` returns the job to
    apply in place of ``realjob.manifest``'s (e.g. a role's own shell line before the wrapper). The operator is the chart's
    (``installed.install``) in ``mode``, with ``chart_values`` (``key=value``) set; the job's namespace is made here
    first, without a Pod Security label (its pods mount the host's venv), so the chart leaves it as it is.
    ``runtime_image``: the roles run from that image (imported into the real node) instead of the base image with
    the host's venv mounted."""
    doc = realjob.load_tiny(base) if base is not None else realjob.load_tiny()
    name = name or str(doc.get("metadata", {}).get("name") or "tiny")
    k = cluster.kubectl
    hk = harness.K(kubectl=k.binary, kubeconfig=k.kubeconfig)
    hk.ensure_crd()
    ns = f"e2e-real-{uuid.uuid4().hex[:6]}"
    k.run("create", "namespace", ns)
    if prepare is not None:
        prepare(ns)
    checkpoints = workdir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    checkpoints.chmod(0o777)    # a hostPath: the pods run as a non-root UID (render/security.py), fsGroup skips it
    checkpoints.chmod(0o777)        # role pods run as UID 1000 (restricted Pod Security); a hostPath keeps host modes
    try:
        rel = installed.install(cluster, watch=(ns,) if mode == installed.NAMESPACED else (), workdir=workdir,
                                extra=chart_values)
    except BaseException:
        if not keep_namespace:
            k.run("delete", "namespace", ns, "--wait=false", check=False)
        raise
    log(f"operator installed by the chart ({rel.mode}, release {rel.name} in {rel.namespace})")
    try:
        parts = realjob.image_parts(runtime_image) if runtime_image else None
        job = realjob.manifest(name=name, namespace=ns, checkpoint_dir=checkpoints, base=doc, parts=parts)
        job = adapt(job) if adapt is not None else job
        result = Run(k=k, namespace=ns, name=name, workdir=workdir, kill_after_step=kill_after_step,
                     timeout_s=timeout_s, export_after_step=export_after_step, fault=fault).execute(job)
        result.checkpoints = sorted(p.name for p in checkpoints.iterdir())
        if result.export is not None and result.export.get("path"):     # the folder, seen on the host
            folder = checkpoints / pathlib.PurePosixPath(str(result.export["path"])).relative_to(
                realjob.CONTAINER_CHECKPOINTS)
            result.export["files"] = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else None
        (workdir / "pods.json").write_text(json.dumps(result.pods, indent=1))
        requests = rel.requests()
        result.operator = installed.summary(rel)
        result.api_requests = {f"{v} {r}": n for (v, r), n in sorted(requests.items())}
        result.undeclared = installed.undeclared(requests)
        return result
    finally:
        (workdir / "operator.log").write_text(rel.logs(tail=2000))
        rel.uninstall()
        if not keep_namespace:
            k.run("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout_s=150)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="run_real", description=__doc__.split("\n")[0])
    p.add_argument("--workdir", help="artefacts (logs, checkpoints); default: a new temp dir")
    p.add_argument("--kill-after-step", type=int, default=8, help="kill the trainer at this step (-1: never)")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--export-after-step", type=int, default=-1,
                   help="annotate the RLJob with an export request once trainer 0 reached this step (-1: never)")
    p.add_argument("--manifest", type=pathlib.Path,
                   help="the RLJob to run (default examples/tiny.yaml), e.g. examples/tiny-fsdp.yaml")
    p.add_argument("--runtime-image", help="run the roles from this runtime image (e.g. kubeforge.local/runtime:"
                   "0.1.0-cpu, imported into the real node by `make images`) instead of the host's venv")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))    # run the clean-ups (operator, namespace, cluster)
    got = acquire_cluster(start=True)
    if isinstance(got, str):
        log(got)
        return 2
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="kf-e2e-real-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = run(cluster=got.cluster, workdir=workdir, timeout_s=args.timeout, base=args.manifest,
                     kill_after_step=None if args.kill_after_step < 0 else args.kill_after_step,
                     export_after_step=None if args.export_after_step < 0 else args.export_after_step,
                     runtime_image=args.runtime_image)
    finally:
        if got.started and os.environ.get("KF_KEEP_CLUSTER") != "1":
            lifecycle.down(workdir=got.cluster.workdir)
    figures = {**result.figures(), "cluster_setup_s": _r(got.setup_seconds), "workdir": str(workdir)}
    print("E2E-REAL " + json.dumps(figures), flush=True)
    print(json.dumps(result.status), flush=True)
    served = args.export_after_step < 0 or bool(result.export and result.export.get("files"))
    return 0 if result.succeeded and served else 1


if __name__ == "__main__":
    sys.exit(main())
