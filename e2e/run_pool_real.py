"""A GeneratorPool and two LoRA RLJobs in real pods: one vLLM engine serving both jobs on the real node, with a
foreign key refused, the engine pod deleted mid-run and one job deleted mid-run (issue 40, "Done when").

```
 helm install (namespaced over ns) ── pool "shared" (1 engine, the tiny model, CPU vLLM) + pool-job-a + pool-job-b
   ──▶ both trainers at step >= FAULT_STEP
   ──▶ foreign key: from this process, through the pod network (host -> pod IP on kf0), job B's key offered at
       job A's data port of the engine: refused, the engine's unauthenticated count rises (its /metrics, pod IP)
   ──▶ engine loss: kubectl delete pod shared-pool-0 (SIGTERM: it prints its ledger and leaves); the StatefulSet
       makes a new one; its READY: each trainer pushes its adapter again, re-issues its work
   ──▶ both trainers stepped after the new engine's start ──▶ kubectl delete rljob pool-job-a
   ──▶ pool-job-b goes on to Succeeded; the pool's status and jobs file drop pool-job-a
   ──▶ pool-job-b and the pool deleted: the last engine's ledger (SIGTERM) in its log
```

Role: the driver of ``e2e/test_pool_real.py`` (which prints ``E2E-POOL {figures}``). The pods run this checkout from the host's venv as ``realjob`` makes them (busybox base
image, hostPath mounts, the real node's selector and toleration; the engine eager, without torch.compile, with the
host's ``lscpu``): the pool's spec takes the same pod settings a role does. Jobs: ``examples/pool/job-{a,b}.yaml``,
on policy (``maxPolicyLag: 0``, as ``tests/runtime/test_pool_run.py``), job a long enough to be deleted while it
runs, job b ``STEPS_B`` steps.

Neighbours: ``run_real`` (cluster, log following, JSON lines), ``realjob`` (pod parts), ``installed`` (the
chart's operator). Every wait is bounded; whatever the run saw is returned, the test judges it.
"""
from __future__ import annotations

import base64
import copy
import dataclasses
import json
import pathlib
import re
import statistics
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

_E2E = pathlib.Path(__file__).resolve().parent
if str(_E2E) not in sys.path:
    sys.path.insert(0, str(_E2E))

import installed  # noqa: E402
import realjob  # noqa: E402
import run_real  # noqa: E402
from run_real import LABEL_JOB, LogFollower, harness, kube, lifecycle, log, realnode  # noqa: E402

POOL_DIR = run_real.ROOT / "examples" / "pool"
POOL = "shared"
JOB_A, JOB_B = "pool-job-a", "pool-job-b"
ENGINE = f"{POOL}-pool-0"
LABEL_POOL = "kubeforge.dev/pool"
STEPS_A = 400         # job a is deleted while it runs: never reached
STEPS_B = 150         # job b: to Succeeded, stepping on (about a step a second) well past job a's deletion
FAULT_STEP = 2        # both trainers at this step: the foreign key, then the engine pod deleted
METRICS_PORT = 29500
PORT_DATA = 1         # contract.PORT_DATA: a job's data port is its port base + 1


def pool_manifest(*, namespace: str, parts: realnode.PodParts) -> dict[str, Any]:
    """``examples/pool/pool.yaml`` in ``namespace`` with the pod settings of a real-node generator role."""
    doc = realjob.load_tiny(POOL_DIR / "pool.yaml")
    doc["metadata"] = {"name": POOL, "namespace": namespace}
    lscpu = ([{"name": "kf-lscpu", "hostPath": {"path": realjob.LSCPU, "type": "File"}}],
             [{"name": "kf-lscpu", "mountPath": realjob.LSCPU, "readOnly": True}])
    spec = realjob.role_template(doc["spec"], parts=parts, extra_env={"TORCHDYNAMO_DISABLE": "1"},
                                 volumes=lscpu[0], mounts=lscpu[1])
    spec["enforceEager"] = True
    doc["spec"] = spec
    return doc


def job_manifest(name: str, *, namespace: str, steps: int, checkpoint_dir: pathlib.Path,
                 parts: realnode.PodParts) -> dict[str, Any]:
    """``examples/pool/<job>.yaml`` on policy, ``steps`` steps, its verifier and trainer on the real node (the
    trainer's checkpoints in ``checkpoint_dir`` on the host); no generator role: the pool samples."""
    doc = realjob.load_tiny(POOL_DIR / f"{name.removeprefix('pool-')}.yaml")
    doc["metadata"] = {"name": name, "namespace": namespace}
    spec = doc["spec"]
    spec["algorithm"].update(steps=steps, maxPolicyLag=0)
    spec["checkpoint"] = {**spec.get("checkpoint", {}), "path": realjob.CONTAINER_CHECKPOINTS}
    roles = spec.setdefault("roles", {})
    for role in ("verifier", "trainer"):
        vols: list[dict[str, Any]] = []
        mounts: list[dict[str, Any]] = []
        if role == "trainer":
            vols = [{"name": realjob.CHECKPOINT_VOLUME,
                     "hostPath": {"path": str(checkpoint_dir), "type": "DirectoryOrCreate"}}]
            mounts = [{"name": realjob.CHECKPOINT_VOLUME, "mountPath": realjob.CONTAINER_CHECKPOINTS}]
        roles[role] = realjob.role_template(roles.get(role) or {}, parts=parts, extra_env={}, volumes=vols,
                                            mounts=mounts)
    return doc


def step_records(text: str) -> list[dict[str, Any]]:
    """Trainer 0's per-step records in a log (not the closing ``done`` record)."""
    return [d for d in run_real.json_lines(text) if isinstance(d.get("step"), int) and "mean_reward" in d
            and "done" not in d]


def unauthenticated(ip: str) -> float:
    """The engine's ``kubeforge_rollouts_dropped_total{reason="unauthenticated"}`` from its pod's /metrics."""
    with urllib.request.urlopen(f"http://{ip}:{METRICS_PORT}/metrics", timeout=10) as r:  # noqa: S310
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kubeforge_rollouts_dropped_total{") and 'reason="unauthenticated"' in line)


def intrude(ip: str, port: int, *, server_key: bytes, holder_key: bytes) -> Any:
    """A ZeroMQ peer holding ``holder_key`` (job b's) that knows the public key of ``server_key`` (job a's),
    pushing a WORK and a SYNC at job a's data socket of the engine at ``ip:port``. Returns the socket (to close)."""
    import zmq

    from kubeforge.runtime import transport, types, wire

    server = transport.CurveKeys.from_job_key(server_key)
    holder = transport.CurveKeys.from_job_key(holder_key)
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 0)
    sock.curve_serverkey = server.public
    sock.curve_publickey, sock.curve_secretkey = holder.public, holder.secret
    sock.connect(f"tcp://{ip}:{port}")
    for msg in (wire.Sync(version=99, step=99, host=ip, port=1, world_size=2),
                wire.Work(step=1, policy_version=0, prompts=(types.Prompt(index=0, text="a", answer="a"),))):
        sock.send(wire.encode(msg), zmq.NOBLOCK)
    return sock


@dataclasses.dataclass(kw_only=True)
class PoolResult:
    statuses: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)   # job -> last status seen
    trainer_logs: dict[str, list[str]] = dataclasses.field(default_factory=dict)    # job -> trainer-0 logs
    engine_logs: list[str] = dataclasses.field(default_factory=list)                # one per engine incarnation
    engine_pods: list[dict[str, Any]] = dataclasses.field(default_factory=list)     # every engine pod seen
    job_pods: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    foreign: dict[str, Any] = dataclasses.field(default_factory=dict)
    engine_loss: dict[str, Any] = dataclasses.field(default_factory=dict)
    job_deleted: dict[str, Any] = dataclasses.field(default_factory=dict)
    pool_status: dict[str, Any] = dataclasses.field(default_factory=dict)           # after job a went
    jobs_file: list[str] = dataclasses.field(default_factory=list)                  # the jobs it lists then
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    failures: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)                     # what the driver could not do

    def records(self, job: str) -> list[dict[str, Any]]:
        return [d for text in self.trainer_logs.get(job, []) for d in step_records(text)]

    def ledgers(self) -> list[dict[str, Any]]:
        """Each engine incarnation's closing ledger (``pool-shared-0: {...}``, printed at its SIGTERM)."""
        out = []
        for text in self.engine_logs:
            for line in text.splitlines():
                m = re.search(rf"pool-{POOL}-0: (\{{.*\}})\s*$", line)
                if m and '"jobs"' in m.group(1):
                    out.append(json.loads(m.group(1)))
        return out

    def figures(self) -> dict[str, Any]:
        times = [d["time"] for d in self.records(JOB_B)]
        gaps = [round(b - a, 1) for a, b in zip(times, times[1:])]
        return {"b_step_gaps_s": gaps, "b_step_gap_median_s": statistics.median(gaps) if gaps else None,
                "timings": {k: round(v, 1) for k, v in self.timings.items()},
                "steps": {j: [d["step"] for d in self.records(j)] for j in (JOB_A, JOB_B)},
                "phases": {j: s.get("phase") for j, s in self.statuses.items()},
                "foreign": self.foreign, "engine_loss": self.engine_loss, "job_deleted": self.job_deleted,
                "engine_ledgers": self.ledgers(), "pool_status": {k: self.pool_status.get(k) for k in (
                    "attachedJobs", "jobPorts", "readyEngines")}, "jobs_file": self.jobs_file,
                "failures": [{k: v for k, v in f.items() if k != "log_tail"} for f in self.failures],
                "errors": self.errors}


def _ready(pod: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in pod.get("status", {}).get("conditions") or [])


def _running(pod: dict[str, Any]) -> bool:
    return any("running" in (cs.get("state") or {}) for cs in pod.get("status", {}).get("containerStatuses") or [])


class PoolRun:
    """The watch loop: follows each job's trainer 0 and every engine incarnation, fires the faults in order."""

    def __init__(self, *, k: kube.Kubectl, namespace: str, workdir: pathlib.Path, timeout_s: float) -> None:
        self.k, self.ns, self.workdir, self.timeout_s = k, namespace, workdir, timeout_s
        self.followers: dict[str, LogFollower] = {}      # "<job or engine>:<pod uid>" -> follower
        self.reporter = run_real.Run(k=k, namespace=namespace, name=JOB_A, workdir=workdir, kill_after_step=None,
                                     timeout_s=timeout_s)   # its report_failures only
        self.seen_engines: dict[str, dict[str, Any]] = {}
        self.seen_jobs: dict[str, dict[str, Any]] = {}
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def pods(self) -> list[dict[str, Any]]:
        return self.k.get_json("pods", "-n", self.ns)["items"]  # type: ignore[no-any-return]

    def status(self, job: str) -> dict[str, Any] | None:
        got = self.k.run("get", "rljob", job, "-n", self.ns, "-o", "json", check=False)
        return (json.loads(got.stdout).get("status") or {}) if got.returncode == 0 else None

    def follow(self, pods: list[dict[str, Any]]) -> None:
        for p in pods:
            md = p["metadata"]
            labels = md.get("labels") or {}
            if md.get("deletionTimestamp") or not _running(p):
                continue
            if labels.get(LABEL_POOL) == POOL and md["name"] == ENGINE:
                key, container = f"engine:{md['uid']}", "generator"
                self.seen_engines[md["uid"]] = p
            elif md["name"] in (f"{JOB_A}-trainer-0", f"{JOB_B}-trainer-0"):
                key, container = f"{labels.get(LABEL_JOB)}:{md['uid']}", "trainer"
            else:
                continue
            if key not in self.followers:
                path = self.workdir / f"{key.replace(':', '-')[:40]}.log"
                self.followers[key] = LogFollower(k=self.k, namespace=self.ns, pod=md["name"], container=container,
                                                  path=path)

    def steps(self, job: str) -> list[dict[str, Any]]:
        return [d for key, f in self.followers.items() if key.startswith(f"{job}:")
                for d in step_records(f.path.read_text(errors="replace"))]

    def engine(self, pods: list[dict[str, Any]]) -> dict[str, Any] | None:
        return next((p for p in pods if p["metadata"]["name"] == ENGINE and not p["metadata"].get(
            "deletionTimestamp")), None)

    def key(self, job: str) -> bytes:
        """The job's key, from the Secret its trainer pods reference (the operator wrote it)."""
        sts = self.k.get_json("statefulset", f"{job}-trainer", "-n", self.ns)
        ref = next(e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]
                   if e["name"] == "KUBEFORGE_JOB_KEY")["valueFrom"]["secretKeyRef"]
        secret = self.k.get_json("secret", ref["name"], "-n", self.ns)
        return bytes.fromhex(base64.b64decode(secret["data"][ref["key"]]).decode())

    def foreign_key(self, engine: dict[str, Any], result: PoolResult) -> None:
        """Job b's key offered at job a's socket of the engine: refused and counted (bounded wait)."""
        ip = engine["status"]["podIP"]
        pool = self.k.get_json("generatorpool", POOL, "-n", self.ns)
        base = next(p["portBase"] for p in pool["status"]["jobPorts"] if p["name"] == JOB_A)
        before = unauthenticated(ip)
        t = time.monotonic()
        sock = intrude(ip, base + PORT_DATA, server_key=self.key(JOB_A), holder_key=self.key(JOB_B))
        try:
            after = before
            while time.monotonic() - t < 120 and after <= before:
                time.sleep(1.0)
                after = unauthenticated(ip)
        finally:
            sock.close(0)
        result.foreign = {"engine_ip": ip, "port": base + PORT_DATA, "unauthenticated_before": before,
                          "unauthenticated_after": after, "seconds": round(time.monotonic() - t, 1)}
        log(f"foreign key at {ip}:{base + PORT_DATA}: unauthenticated {before} -> {after}")

    def execute(self, docs: list[dict[str, Any]]) -> PoolResult:
        result = PoolResult()
        for doc in docs:          # installed.install waited until the webhook answers through its Service
            self.k.apply(doc)
        log(f"applied the pool and {JOB_A}, {JOB_B} in {self.ns}")
        deadline = self.t0 + self.timeout_s
        loss_t: float | None = None          # wall clock of the engine pod's deletion
        old_uid: str | None = None
        ready_t: float | None = None         # wall clock when the new engine pod was seen Ready
        deleted_t: float | None = None       # wall clock of job a's deletion
        try:
            while time.monotonic() < deadline:
                pods = self.pods()
                for p in pods:
                    if p["metadata"].get("labels", {}).get(LABEL_JOB):
                        self.seen_jobs[p["metadata"]["uid"]] = p
                self.follow(pods)
                self.reporter.report_failures(pods)
                statuses = {j: self.status(j) for j in (JOB_A, JOB_B)}
                for j, st in statuses.items():
                    if st is not None:
                        result.statuses[j] = st
                    if st and st.get("phase") == "Running" and f"running_{j}" not in result.timings:
                        result.timings[f"running_{j}"] = self.now()
                steps = {j: self.steps(j) for j in (JOB_A, JOB_B)}
                engine = self.engine(pods)
                if not result.foreign and engine and all(len(s) >= FAULT_STEP for s in steps.values()):
                    result.timings["foreign_key"] = self.now()
                    self.foreign_key(engine, result)
                if result.foreign and loss_t is None and engine:
                    old_uid = engine["metadata"]["uid"]
                    self.k.run("delete", "pod", ENGINE, "-n", self.ns, "--wait=false")
                    loss_t = time.time()
                    result.timings["engine_deleted"] = self.now()
                    result.engine_loss = {"at_steps": {j: len(s) for j, s in steps.items()}, "old_uid": old_uid}
                    log(f"deleted {ENGINE} at steps {result.engine_loss['at_steps']}")
                if loss_t is not None and engine and engine["metadata"]["uid"] != old_uid and _ready(engine) \
                        and "engine_ready_again" not in result.timings:
                    result.timings["engine_ready_again"] = self.now()
                    ready_t = time.time()
                    result.engine_loss["new_uid"] = engine["metadata"]["uid"]
                    log(f"new engine pod Ready {self.now() - result.timings['engine_deleted']:.1f}s after the delete")
                # steps the new engine served: recorded after it was Ready (the old one serves on until the kubelet
                # has stopped it, seconds after the delete on a loaded machine: a dozen steps here)
                after_loss = {j: [d for d in s if ready_t is not None and d["time"] > ready_t] for j, s in steps.items()}
                if loss_t is not None and "first_steps_after_loss" not in result.timings and all(after_loss.values()):
                    result.timings["first_steps_after_loss"] = self.now()
                    result.engine_loss["first_step_after"] = {j: s[0]["step"] for j, s in after_loss.items()}
                if deleted_t is None and "first_steps_after_loss" in result.timings:
                    if statuses[JOB_B] and statuses[JOB_B].get("phase") in ("Succeeded", "Failed"):
                        result.errors.append(f"{JOB_B} ended before {JOB_A} could be deleted while it ran")
                        break
                    self.k.run("delete", "rljob", JOB_A, "-n", self.ns, "--wait=false")
                    deleted_t = time.time()
                    result.timings["job_a_deleted"] = self.now()
                    result.job_deleted = {"at": deleted_t, "steps_a": len(steps[JOB_A]), "steps_b": len(steps[JOB_B])}
                    log(f"deleted {JOB_A} at its step {len(steps[JOB_A])} ({JOB_B} at {len(steps[JOB_B])})")
                if deleted_t is not None and "pool_dropped_a" not in result.timings:
                    pool = self.k.get_json("generatorpool", POOL, "-n", self.ns)
                    if JOB_A not in (pool.get("status") or {}).get("attachedJobs", [JOB_A]):
                        result.timings["pool_dropped_a"] = self.now()
                if deleted_t is not None and "jobs_file_dropped_a" not in result.timings:
                    cm = self.k.get_json("configmap", f"{POOL}-pool-jobs", "-n", self.ns)
                    if JOB_A not in [e["name"] for e in json.loads(cm["data"]["jobs.json"])["jobs"]]:
                        result.timings["jobs_file_dropped_a"] = self.now()
                b_phase = (statuses[JOB_B] or {}).get("phase")
                if b_phase in ("Succeeded", "Failed"):
                    result.timings[f"{b_phase.lower()}_{JOB_B}"] = self.now()
                    if deleted_t is None:
                        result.errors.append(f"{JOB_B} ended ({b_phase}) before {JOB_A} was deleted")
                    break
                if (statuses[JOB_A] or {}).get("phase") == "Failed":
                    result.errors.append(f"{JOB_A} failed: {json.dumps(statuses[JOB_A])[:1000]}")
                    break
                time.sleep(1.0)
            else:
                result.errors.append(f"timed out after {self.timeout_s:.0f}s")
            log(f"watch ended at {self.now():.1f}s: phases {({j: (s or {}).get('phase') for j, s in statuses.items()})}"
                f"{'; ' + '; '.join(result.errors) if result.errors else ''}")
            self._settle(result)
        finally:
            self._collect(result)
        return result

    def _settle(self, result: PoolResult) -> None:
        """After job b ended: the pool's status and jobs file (job a gone from both, bounded wait), then job b and
        the pool deleted so the last engine prints its ledger at its SIGTERM."""
        end = time.monotonic() + 180
        while time.monotonic() < end:
            pool = self.k.get_json("generatorpool", POOL, "-n", self.ns)
            cm = self.k.get_json("configmap", f"{POOL}-pool-jobs", "-n", self.ns)
            result.pool_status = pool.get("status") or {}
            result.jobs_file = [e["name"] for e in json.loads(cm["data"]["jobs.json"])["jobs"]]
            if JOB_A not in result.pool_status.get("attachedJobs", []) and JOB_A not in result.jobs_file:
                break
            time.sleep(2.0)
        self.k.run("delete", "rljob", JOB_B, "-n", self.ns, "--wait=false", check=False)
        self.k.run("delete", "generatorpool", POOL, "-n", self.ns, "--wait=true", "--timeout=180s", check=False,
                   timeout_s=200)

    def _collect(self, result: PoolResult) -> None:
        for key, f in self.followers.items():
            text = f.finish(timeout_s=60)
            if key.startswith("engine:"):
                result.engine_logs.append(text)
            else:
                result.trainer_logs.setdefault(key.split(":")[0], []).append(text)
        result.engine_pods = list(self.seen_engines.values())
        result.job_pods = list(self.seen_jobs.values())
        result.failures = list(self.reporter.failures)
        result.timings["total"] = self.now()


def run(*, cluster: lifecycle.Cluster, workdir: pathlib.Path, timeout_s: float = 1500.0) -> PoolResult:
    """The pool and both jobs in a fresh namespace under the chart's operator (namespaced mode over it)."""
    k = cluster.kubectl
    harness.K(kubectl=k.binary, kubeconfig=k.kubeconfig).ensure_crd()
    ns = f"e2e-pool-{uuid.uuid4().hex[:6]}"
    k.run("create", "namespace", ns)
    parts = realnode.venv_python_parts()
    docs = [pool_manifest(namespace=ns, parts=parts)]
    for job, steps in ((JOB_A, STEPS_A), (JOB_B, STEPS_B)):
        checkpoints = workdir / f"checkpoints-{job}"
        checkpoints.mkdir(parents=True, exist_ok=True)
        checkpoints.chmod(0o777)     # role pods run as UID 1000; a hostPath keeps the host's modes
        docs.append(job_manifest(job, namespace=ns, steps=steps, checkpoint_dir=checkpoints, parts=parts))
    t0 = time.monotonic()
    try:
        rel = installed.install(cluster, watch=(ns,), workdir=workdir)
    except BaseException:
        k.run("delete", "namespace", ns, "--wait=false", check=False)
        raise
    install_s = time.monotonic() - t0
    try:
        result = PoolRun(k=k, namespace=ns, workdir=workdir, timeout_s=timeout_s).execute(copy.deepcopy(docs))
        result.timings["operator_install"] = install_s
        return result
    finally:
        (workdir / "operator.log").write_text(rel.logs(tail=2000))
        # while the operator runs: it takes the pool's finalizer off once no job is attached (else the namespace's
        # deletion would wait for it forever); by hand when it does not within the bound
        k.run("delete", "rljobs", "--all", "-n", ns, "--wait=false", check=False)
        if k.run("delete", "generatorpool", POOL, "-n", ns, "--wait=true", "--timeout=120s", check=False,
                 timeout_s=150).returncode != 0:
            k.run("patch", "generatorpool", POOL, "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                  check=False)
        rel.uninstall()
        k.run("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout_s=150)

