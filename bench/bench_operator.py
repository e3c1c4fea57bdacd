"""Operator bench at scale: N kwok GPU nodes, J RLJobs of ~10 gang-scheduled pods each, on the real control plane.

    python bench/bench_operator.py --nodes 1000 --jobs 1000        # starts (and stops) its own cluster
    python bench/bench_operator.py --jobs 50 --pods-per-job 3 --baseline   # on $KUBECONFIG's cluster

Phases, each timed from the bench's side through ONE pod watch (no polling LISTs that would load the API server):
1. (``--baseline``) the same pods as plain StatefulSets + one Coscheduling PodGroup per job, applied directly:
   what the control plane alone needs for this load, without the operator.
2. J RLJobs applied at once (8 client threads) with the operator running: time until every pod of every job is
   Running, per-job p50/p99, pods/s.
3. Recovery: ``--fail-fraction`` of all pods (seeded choice) fail through kwok's chaos stage (container exit 1,
   pod Failed); time until every hit job runs again with all its pods Running in a new attempt.
Reported beside: the operator's reconcile latency (event -> pass done) and pass duration, p50/p99 from its own
histograms; its peak RSS and CPU; CPU seconds per control-plane process per phase (where the time goes); the
load average. The last stdout line is one JSON object.

With ``--nodes`` the bench starts its own cluster (``KF_CLUSTER_NAME``, default ``kf-bench-operator``) with that
many 8-GPU kwok nodes in 2 zones, racks of ~20 nodes, the controller-manager's client limits raised, and stops it
afterwards (``--keep-cluster`` keeps it). Without ``--nodes`` it uses ``$KUBECONFIG`` (``make cluster-up``).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "operator"), str(ROOT / "e2e")]

import harness  # noqa: E402
import urllib3  # noqa: E402
import yaml  # noqa: E402

from kubeforge.api import contract  # noqa: E402
from kubeforge.operator import apply  # noqa: E402

#: kwok nodes carry this taint; the bench's pods (operator's and baseline's alike) tolerate it.
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake", "effect": "NoSchedule"}
GPU = "nvidia.com/gpu"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
BASE_LABEL = "kubeforge.dev/bench-job"
ROLES = ("generator", "verifier", "trainer")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, max(0, int(round(q * (len(xs) - 1)))))], 3) if xs else float("nan")


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50": pct(xs, 0.5), "p99": pct(xs, 0.99), "max": round(max(xs), 3) if xs else float("nan"),
            "mean": round(statistics.fmean(xs), 3) if xs else float("nan"), "n": len(xs)}


def role_sizes(pods: int) -> dict[str, int]:
    """~10 pods -> generator 4, verifier 4, trainer 2 (generators and trainers take one GPU each)."""
    if pods < 3:
        raise SystemExit("--pods-per-job must be >= 3 (one pod per role at least)")
    trainer = max(1, pods // 5)
    generator = max(1, (pods - trainer + 1) // 2)
    return {"generator": generator, "verifier": pods - trainer - generator, "trainer": trainer}


# ---------------------------------------------------------------- what the bench applies
def rljob(i: int, ns: str, sizes: dict[str, int]) -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "examples" / "tiny.yaml").read_text())
    doc["metadata"] = {"name": f"b{i:04d}", "namespace": ns}
    doc["spec"]["failurePolicy"] = {"maxRestarts": 5}
    for role in ROLES:
        r = doc["spec"]["roles"].setdefault(role, {})
        r.update(replicas=sizes[role], tolerations=[TOLERATION])
        if role != "verifier":
            r["resources"] = {"limits": {GPU: 1}}
    return doc


def baseline_docs(i: int, ns: str, sizes: dict[str, int]) -> list[dict[str, Any]]:
    """What the operator would make pods from, minus the operator: one PodGroup + one StatefulSet per role."""
    job = f"s{i:04d}"
    docs: list[dict[str, Any]] = [{"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                                   "metadata": {"name": job, "namespace": ns},
                                   "spec": {"minMember": sum(sizes.values())}}]
    for role in ROLES:
        sel = {BASE_LABEL: job, "role": role}
        container: dict[str, Any] = {"name": "c", "image": "kubeforge/runtime:test"}
        if role != "verifier":
            container["resources"] = {"limits": {GPU: 1}}
        docs.append({
            "apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": f"{job}-{role}", "namespace": ns, "labels": sel},
            "spec": {"replicas": sizes[role], "serviceName": f"{job}-{role}", "podManagementPolicy": "Parallel",
                     "selector": {"matchLabels": sel},
                     "template": {"metadata": {"labels": {**sel, "scheduling.x-k8s.io/pod-group": job}},
                                  "spec": {"containers": [container], "tolerations": [TOLERATION]}}}})
    return docs


def post_all(c: apply.Cluster, docs: Iterable[dict[str, Any]], threads: int = 8) -> float:
    """POST every document (8 at a time); seconds taken."""
    t0 = time.monotonic()

    def post(d: dict[str, Any]) -> None:
        c.request("POST", apply.path_of(d["apiVersion"], d["kind"], d["metadata"]["namespace"]), body=d)

    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        list(ex.map(post, docs))
    return time.monotonic() - t0


# ---------------------------------------------------------------- one pod watch, per-job readiness
@dataclasses.dataclass
class PodState:
    job: str
    name: str
    phase: str
    attempt: int
    deleting: bool


class PodWatch:
    """Watches the pods of one namespace that carry ``label``; calls ``check(job)`` after each event of a job.

    ``wait_jobs(jobs, min_attempt)`` returns per job the time (since ``t0``) at which it first had ``want`` pods
    Running, none terminating, all of attempt >= its minimum."""

    def __init__(self, c: apply.Cluster, ns: str, label: str, want: int) -> None:
        self.c, self.ns, self.label, self.want = c, ns, label, want
        self.pods: dict[str, PodState] = {}
        self.first_running: dict[str, float] = {}      # pod uid -> monotonic time it was first seen Running
        self.lock = threading.Condition()
        self.goal: dict[str, int] = {}                 # job -> min attempt
        self.done: dict[str, float] = {}
        self.events = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="pod-watch")
        self.thread.start()

    def _path(self) -> str:
        return apply.path_of("v1", "Pod", self.ns)

    def _run(self) -> None:
        try:
            rv = ""
            while not self.stop.is_set():
                if not rv:
                    listed = self.c.request("GET", self._path(), query={"labelSelector": self.label}) or {}
                    for p in listed.get("items", []):
                        self._apply("MODIFIED", p)
                    rv = listed.get("metadata", {}).get("resourceVersion", "")
                rv = self._watch(rv)
        except BaseException as exc:  # noqa: BLE001 - surfaced by wait_jobs
            self.error = exc
            with self.lock:
                self.lock.notify_all()

    def _watch(self, rv: str) -> str:
        q = {"labelSelector": self.label, "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true",
             "timeoutSeconds": "60"}
        resp = self.c._http.request(  # the bench reuses apply.Cluster's authenticated pool for a stream
            "GET", self.c._server + self._path() + "?" + urllib.parse.urlencode(q),
            headers=self.c._headers, preload_content=False, timeout=urllib3.Timeout(connect=10, read=90))
        try:
            buf = b""
            for chunk in resp.stream(1 << 16):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    if ev["type"] == "ERROR":
                        return ""                  # expired: list again
                    obj = ev["object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if ev["type"] != "BOOKMARK":
                        self._apply(ev["type"], obj)
                if self.stop.is_set():
                    break
        finally:
            resp.release_conn()
        return rv

    def _apply(self, kind: str, p: dict[str, Any]) -> None:
        md = p["metadata"]
        labels = md.get("labels") or {}
        job = labels.get(self.label, "")
        now = time.monotonic()
        with self.lock:
            self.events += 1
            if kind == "DELETED":
                self.pods.pop(md["uid"], None)
            else:
                phase = (p.get("status") or {}).get("phase", "Pending")
                self.pods[md["uid"]] = PodState(job=job, name=md["name"], phase=phase,
                                                attempt=int(labels.get(contract.LABEL_ATTEMPT, 0)),
                                                deleting=bool(md.get("deletionTimestamp")))
                if phase == "Running":
                    self.first_running.setdefault(md["uid"], now)
            if job in self.goal and job not in self.done and self._ready(job):
                self.done[job] = now
                self.lock.notify_all()

    def _ready(self, job: str) -> bool:
        mine = [s for s in self.pods.values() if s.job == job]
        return (len(mine) >= self.want and all(s.phase == "Running" and not s.deleting for s in mine)
                and all(s.attempt >= self.goal[job] for s in mine))

    def attempts(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for s in self.pods.values():
                out[s.job] = max(out.get(s.job, 0), s.attempt)
            return out

    def wait_jobs(self, goal: dict[str, int], *, timeout_s: float, progress: Callable[[int], None]) -> dict[str, float]:
        """Block until every job in ``goal`` is ready; returns job -> monotonic time it became ready."""
        with self.lock:
            self.goal, self.done = dict(goal), {}
            for job in goal:
                if self._ready(job):
                    self.done[job] = time.monotonic()
            deadline = time.monotonic() + timeout_s
            last_report = 0.0
            while len(self.done) < len(goal):
                if self.error is not None:
                    raise RuntimeError(f"pod watch failed: {self.error!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"only {len(self.done)}/{len(goal)} jobs ready after {timeout_s:.0f}s")
                self.lock.wait(min(left, 5.0))
                if time.monotonic() - last_report > 30:
                    last_report = time.monotonic()
                    progress(len(self.done))
            return dict(self.done)

    def running_pods(self) -> list[PodState]:
        with self.lock:
            return [s for s in self.pods.values() if s.phase == "Running" and not s.deleting]

    def close(self) -> None:
        self.stop.set()


# ---------------------------------------------------------------- where the CPU goes
def cpu_seconds(pid: int) -> float:
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds per named process (control-plane components, the operator, the bench itself)."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = procs
        self.last = {n: cpu_seconds(p) for n, p in procs.items()}

    def lap(self) -> dict[str, float]:
        now = {n: cpu_seconds(p) for n, p in self.procs.items()}
        out = {n: round(now[n] - self.last.get(n, 0.0), 1) for n in now}
        self.last = now
        return out


def control_plane_pids(workdir: str | None) -> dict[str, int]:
    if not workdir:
        return {}
    from kfcluster import procs
    out: dict[str, int] = {}
    for pid, cmd in procs.processes_mentioning(os.path.join(workdir, "kwok")).items():
        out[os.path.basename(cmd.split(" ", 1)[0])] = pid
    return out


# ---------------------------------------------------------------- operator metrics
def histogram(text: str, name: str) -> dict[str, float]:
    """p50/p99/mean/count of a Prometheus histogram from its exposition text (linear within a bucket)."""
    buckets: list[tuple[float, float]] = []
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
        elif line.startswith(name + "_sum"):
            total = float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count = float(line.rsplit(" ", 1)[1])

    def q(x: float) -> float:
        want, lo, below = x * count, 0.0, 0.0
        for le, n in sorted(buckets):
            if n >= want:
                if le == float("inf"):
                    return lo
                return round(lo + (le - lo) * ((want - below) / max(n - below, 1e-9)), 4)
            lo, below = le, n
        return lo

    return {"p50": q(0.5), "p99": q(0.99), "mean": round(total / count, 4) if count else 0.0, "n": int(count)}


def counter(text: str, name: str) -> float:
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{") or
               ln.startswith(name + " "))


# ---------------------------------------------------------------- phases
def log(msg: str) -> None:
    print(f"[bench-operator {time.strftime('%H:%M:%S')}] {msg} (load {os.getloadavg()[0]:.1f})", file=sys.stderr,
          flush=True)


def run_baseline(c: apply.Cluster, k: harness.K, tag: str, jobs: int, sizes: dict[str, int],
                 timeout_s: float, meter: CpuMeter) -> dict[str, Any]:
    ns = k.namespace(f"bench-base-{tag}")
    want = sum(sizes.values())
    watch = PodWatch(c, ns, BASE_LABEL, want)
    try:
        meter.lap()
        t0 = time.monotonic()
        post_s = post_all(c, (d for i in range(jobs) for d in baseline_docs(i, ns, sizes)))
        done = watch.wait_jobs({f"s{i:04d}": 0 for i in range(jobs)}, timeout_s=timeout_s,
                               progress=lambda n: log(f"baseline: {n}/{jobs} jobs Running"))
        wall = max(done.values()) - t0
        return {"all_running_s": round(wall, 1), "post_s": round(post_s, 1),
                "job_running_s": summary([t - t0 for t in done.values()]),
                "pods_per_s": round(jobs * want / wall, 1), "cpu_s": meter.lap()}
    finally:
        watch.close()
        k.run("delete", "namespace", ns, "--wait=false", check=False)


def run_operator(c: apply.Cluster, k: harness.K, kubeconfig: str, tag: str, jobs: int, sizes: dict[str, int],
                 fail_fraction: float, timeout_s: float, meter: CpuMeter, workers: int) -> dict[str, Any]:
    ns = k.namespace(f"bench-op-{tag}")
    want = sum(sizes.values())
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="bench-operator-"))
    op = harness.Operator(kubeconfig=kubeconfig, log_path=logdir / "operator.log",
                          extra=("-n", ns, "--workers", str(workers)))
    watch = PodWatch(c, ns, contract.LABEL_JOB, want)
    out: dict[str, Any] = {"log": str(logdir / "operator.log")}
    try:
        op.start()
        meter.procs["operator"] = op.proc.pid if op.proc else 0
        meter.lap()
        t0 = time.monotonic()
        names = [f"b{i:04d}" for i in range(jobs)]
        post_s = post_all(c, (rljob(i, ns, sizes) for i in range(jobs)))
        log(f"{jobs} RLJobs posted in {post_s:.1f}s")
        done = watch.wait_jobs({n: 0 for n in names}, timeout_s=timeout_s,
                               progress=lambda n: log(f"operator: {n}/{jobs} jobs Running"))
        wall = max(done.values()) - t0
        start_metrics = op.metrics()
        pod_times = sorted(watch.first_running.values())
        out.update({
            "all_running_s": round(wall, 1), "post_s": round(post_s, 1),
            "job_running_s": summary([t - t0 for t in done.values()]),
            "pods_per_s": round(jobs * want / wall, 1),
            "first_pod_running_s": round(pod_times[0] - t0, 1) if pod_times else None,
            "cpu_s": meter.lap(),
            "reconcile_latency_s": histogram(start_metrics, "kubeforge_operator_reconcile_latency_seconds"),
            "reconcile_pass_s": histogram(start_metrics, "kubeforge_operator_reconcile_duration_seconds"),
            "reconciles": counter(start_metrics, "kubeforge_operator_reconciles_total"),
            "watch_events": counter(start_metrics, "kubeforge_operator_events_total"),
            "peak_rss_mib_after_start": round(op.peak_rss_kib() / 1024, 1),
        })
        log(f"all {jobs} jobs Running after {wall:.1f}s")
        if fail_fraction > 0:
            out["recovery"] = fail_and_recover(c, watch, ns, fail_fraction, timeout_s, meter)
        end_metrics = op.metrics()
        out.update({
            "reconcile_latency_s_total": histogram(end_metrics, "kubeforge_operator_reconcile_latency_seconds"),
            "reconcile_pass_s_total": histogram(end_metrics, "kubeforge_operator_reconcile_duration_seconds"),
            "peak_rss_mib": round(op.peak_rss_kib() / 1024, 1), "operator_cpu_s": round(op.cpu_seconds(), 1),
            "errors": counter(end_metrics, "kubeforge_operator_reconcile_errors_total"),
        })
    finally:
        watch.close()
        op.stop()
        k.run("delete", "namespace", ns, "--wait=false", check=False)
    return out


def fail_and_recover(c: apply.Cluster, watch: PodWatch, ns: str, fraction: float, timeout_s: float,
                     meter: CpuMeter) -> dict[str, Any]:
    running = sorted(watch.running_pods(), key=lambda s: s.name)
    hit = random.Random(0).sample(running, max(1, round(fraction * len(running))))
    attempts = watch.attempts()
    goal = {s.job: attempts[s.job] + 1 for s in hit}
    meter.lap()
    t0 = time.monotonic()

    def fail(s: PodState) -> None:
        c.request("PATCH", apply.path_of("v1", "Pod", ns, s.name), content_type="application/merge-patch+json",
                  body={"metadata": {"labels": {FAIL_LABEL: "true"},
                                     "annotations": {f"{FAIL_LABEL}/exit-code": "1",
                                                     f"{FAIL_LABEL}/reason": "Error"}}})

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(fail, hit))
    fail_s = time.monotonic() - t0
    log(f"failed {len(hit)} pods of {len(goal)} jobs in {fail_s:.1f}s; waiting for new attempts")
    done = watch.wait_jobs(goal, timeout_s=timeout_s, progress=lambda n: log(f"recovery: {n}/{len(goal)} jobs"))
    wall = max(done.values()) - t0
    log(f"all {len(goal)} hit jobs Running again after {wall:.1f}s")
    return {"pods_failed": len(hit), "jobs_hit": len(goal), "fail_patch_s": round(fail_s, 1),
            "all_recovered_s": round(wall, 1), "job_recovered_s": summary([t - t0 for t in done.values()]),
            "cpu_s": meter.lap()}


def start_cluster(nodes: int, timeout_s: float) -> tuple[Any, Any]:
    from kfcluster import config as cfg
    from kfcluster import lifecycle
    pool = cfg.NodePool(count=nodes, gpus=8, zones=("zone-a", "zone-b"), racks_per_block=max(1, nodes // 40))
    env = cfg.from_env()
    config = cfg.from_env(
        name=os.environ.get("KF_CLUSTER_NAME") or "kf-bench-operator", nodes=(pool,), real_node=False,
        ready_timeout_s=max(120.0, nodes * 0.6), disable_qps_limits=True,
        kwok_pod_parallelism=env.kwok_pod_parallelism or 32,
        extra_controller_manager_args={"concurrent-statefulset-syncs": "20", **env.extra_controller_manager_args})
    return lifecycle.up(config), config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=0, help="start a cluster with this many 8-GPU kwok nodes")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--pods-per-job", type=int, default=10)
    ap.add_argument("--fail-fraction", type=float, default=0.1)
    ap.add_argument("--baseline", action="store_true", help="also run the same pods without the operator first")
    ap.add_argument("--workers", type=int, default=16, help="the operator's --workers")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--timeout", type=float, default=1800, help="bound on each wait (s)")
    ap.add_argument("--keep-cluster", action="store_true")
    a = ap.parse_args()
    sizes = role_sizes(a.pods_per_job)
    t_start = time.monotonic()
    cluster = config = None
    workdir = None
    if a.nodes:
        log(f"starting a cluster with {a.nodes} kwok nodes")
        cluster, config = start_cluster(a.nodes, a.timeout)
        kubeconfig, kubectl, workdir = cluster.kubeconfig, cluster.kubectl.binary, cluster.workdir
    else:
        kubeconfig = a.kubeconfig or harness.env_kubeconfig() or ""
        if not kubeconfig:
            raise SystemExit("give --nodes N (own cluster) or --kubeconfig / $KUBECONFIG (make cluster-up)")
        from kfcluster import binaries
        kubectl = str(binaries.bin_dir() / "kubectl")
    cluster_up_s = time.monotonic() - t_start
    out: dict[str, Any] = {"nodes": a.nodes or None, "jobs": a.jobs, "pods_per_job": sum(sizes.values()),
                           "roles": sizes, "gpus_per_job": sizes["generator"] + sizes["trainer"],
                           "cluster_up_s": round(cluster_up_s, 1)}
    try:
        k = harness.K(kubectl=kubectl, kubeconfig=kubeconfig)
        k.ensure_crd()
        c = apply.Cluster(apply.load_credentials(kubeconfig), pool_size=32)
        meter = CpuMeter({**control_plane_pids(workdir), "bench": os.getpid()})
        tag = uuid.uuid4().hex[:6]
        if a.baseline:
            log("baseline: plain StatefulSets + PodGroups, no operator")
            out["baseline_statefulsets_with_podgroup"] = run_baseline(c, k, tag, a.jobs, sizes, a.timeout, meter)
            log(f"baseline: all Running after {out['baseline_statefulsets_with_podgroup']['all_running_s']}s")
        log(f"operator: {a.jobs} RLJobs x {sum(sizes.values())} pods")
        out["operator"] = run_operator(c, k, kubeconfig, tag, a.jobs, sizes, a.fail_fraction, a.timeout, meter,
                                       a.workers)
        out["control_plane_peak_rss_mib"] = {n: round(harness.peak_rss_kib(p) / 1024, 1)
                                             for n, p in control_plane_pids(workdir).items()}
        if "baseline_statefulsets_with_podgroup" in out:
            b = out["baseline_statefulsets_with_podgroup"]
            out["ratio_all_running_vs_baseline"] = round(out["operator"]["all_running_s"] / b["all_running_s"], 2)
    finally:
        out["load_average"] = [round(x, 2) for x in os.getloadavg()]
        out["cpus"] = os.cpu_count()
        if config is not None and not a.keep_cluster:
            from kfcluster import lifecycle
            lifecycle.down(config=config, timeout_s=120)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
