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
histograms; the API requests it sent by verb and resource (its own counter) and its writes per job; its peak RSS
and CPU; CPU seconds per control-plane process per phase (where the time goes); the
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
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import urllib3
import yaml

from kubeforge.api import contract
from kubeforge.operator import apply

# The test cluster's package (e2e/kfcluster: the control plane that --nodes starts, and the operator harness), from
# the harness's editable install (e2e/pyproject.toml, `make venv`).
from kfcluster import harness

import common

ROOT = common.ROOT

#: kwok nodes carry this taint; the bench's pods (operator's and baseline's alike) tolerate it.
LIST_PAGE = 500          # objects per page of the closing LISTs
TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake", "effect": "NoSchedule"}
GPU = "nvidia.com/gpu"
FAIL_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
BASE_LABEL = "kubeforge.dev/bench-job"
ROLES = ("generator", "verifier", "trainer")


#: Bound on the wait, after the bench's pod watch saw the jobs Running (at the start, and again after the failures),
#: for the operator's own record of the same (``kubeforge_operator_gang_running_seconds``,
#: ``kubeforge_operator_recovery_seconds``): the operator observes them in the reconcile pass that follows the pods'
#: Ready events, which on a loaded machine ends seconds after the bench's watch saw them.
RECORD_WAIT_S = 60.0

#: The bench gives up a wait (and reports what it measured) when the machine's available memory drops below this:
#: the machine is shared, and a control plane holding 10,000 pods grows by gigabytes.
MIN_AVAILABLE_GIB = float(os.environ.get("KF_BENCH_MIN_AVAILABLE_GIB", "4"))


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
        self.pods: dict[str, dict[str, PodState]] = {}   # job -> pod uid -> state
        self.first_running: dict[str, float] = {}      # pod uid -> monotonic time it was first seen Running
        self.lock = threading.Condition()
        self.goal: dict[str, int] = {}                 # job -> min attempt
        self.done: dict[str, float] = {}
        self.events = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.curve: list[tuple[float, int]] = []
        self.timed_out = False
        self.low_memory = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="pod-watch")
        self.thread.start()

    def _path(self) -> str:
        return apply.path_of("v1", "Pod", self.ns)

    def _run(self) -> None:
        try:
            rv = ""
            while not self.stop.is_set():
                if not rv:   # (re)list: the list replaces what the watch had, so no deleted pod lingers
                    listed = self.c.request("GET", self._path(), query={"labelSelector": self.label}) or {}
                    with self.lock:
                        self.pods = {}
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
            mine = self.pods.setdefault(job, {})
            if kind == "DELETED":
                mine.pop(md["uid"], None)
            else:
                phase = (p.get("status") or {}).get("phase", "Pending")
                mine[md["uid"]] = PodState(job=job, name=md["name"], phase=phase,
                                           attempt=int(labels.get(contract.LABEL_ATTEMPT, 0)),
                                           deleting=bool(md.get("deletionTimestamp")))
                if phase == "Running":
                    self.first_running.setdefault(md["uid"], now)
            if job in self.goal and job not in self.done and self._ready(job):
                self.done[job] = now
                self.lock.notify_all()

    def _ready(self, job: str) -> bool:
        mine = list(self.pods.get(job, {}).values())
        return (len(mine) >= self.want and all(s.phase == "Running" and not s.deleting for s in mine)
                and all(s.attempt >= self.goal[job] for s in mine))

    def attempts(self) -> dict[str, int]:
        with self.lock:
            out: dict[str, int] = {}
            for job, mine in self.pods.items():
                for s in mine.values():
                    out[job] = max(out.get(job, 0), s.attempt)
            return out

    def wait_jobs(self, goal: dict[str, int], *, timeout_s: float, progress: Callable[[int], None]) -> dict[str, float]:
        """Block until every job in ``goal`` is ready, or ``timeout_s`` passed (then ``self.timed_out``); returns
        job -> monotonic time it became ready (the jobs that did)."""
        self.timed_out = False
        with self.lock:
            self.goal, self.done = dict(goal), {}
            for job in goal:
                if self._ready(job):
                    self.done[job] = time.monotonic()
            t0 = time.monotonic()
            deadline = t0 + timeout_s
            last_report = t0
            self.curve = []        # (seconds since the wait began, jobs ready)
            while len(self.done) < len(goal):
                if self.error is not None:
                    raise RuntimeError(f"pod watch failed: {self.error!r}")
                left = deadline - time.monotonic()
                if common.available_gib(missing=float("inf")) < MIN_AVAILABLE_GIB:
                    self.low_memory = True
                    left = 0
                if left <= 0:
                    self.timed_out = True
                    progress(len(self.done))
                    break
                self.lock.wait(min(left, 5.0))
                if time.monotonic() - last_report > 30:
                    last_report = time.monotonic()
                    self.curve.append((round(last_report - t0), len(self.done)))
                    progress(len(self.done))
            return dict(self.done)

    def running_pods(self) -> list[PodState]:
        with self.lock:
            return [s for mine in self.pods.values() for s in mine.values() if s.phase == "Running" and not s.deleting]

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
    """CPU seconds per named process (control-plane components, the operator, the bench itself), and with ``api``
    the API server's requests and their seconds, per phase."""

    def __init__(self, procs: dict[str, int]) -> None:
        self.procs = procs
        self.last = {n: cpu_seconds(p) for n, p in procs.items()}
        self.api: Any = None

    def lap(self) -> dict[str, Any]:
        now = {n: cpu_seconds(p) for n, p in self.procs.items()}
        out: dict[str, Any] = {n: round(now[n] - self.last.get(n, 0.0), 1) for n in now}
        self.last = now
        if self.api is not None:
            out["apiserver_requests"] = self.api.lap()
        return out


def control_plane_pids(workdir: str | None) -> dict[str, int]:
    if not workdir:
        return {}
    from kfcluster import procs
    out: dict[str, int] = {}
    for pid, cmd in procs.processes_mentioning(os.path.join(workdir, "kwok")).items():
        out[os.path.basename(cmd.split(" ", 1)[0])] = pid
    return out


# ---------------------------------------------------------------- the API server's own account
class ApiserverMeter:
    """Requests the API server served and the seconds it spent on them, by verb and resource, per phase (from its
    ``apiserver_request_duration_seconds`` histogram on /metrics)."""

    def __init__(self, c: apply.Cluster) -> None:
        self.c = c
        self.last = self._read()

    def _read(self) -> dict[str, list[float]]:
        try:
            resp = self.c._http.request("GET", self.c._server + "/metrics", headers=self.c._headers)
            text = resp.data.decode()
        except Exception:  # noqa: BLE001 - a missing figure, not a failed bench
            return {}
        out: dict[str, list[float]] = {}
        for line in text.splitlines():
            for suffix, i in (("_sum{", 1), ("_count{", 0)):
                head = "apiserver_request_duration_seconds" + suffix
                if line.startswith(head):
                    labels = dict(kv.split("=", 1) for kv in line[len(head):line.rindex("}")].split(",") if "=" in kv)
                    res = labels.get("resource", "").strip('"')
                    sub = labels.get("subresource", "").strip('"')
                    verb = labels.get("verb", "").strip('"')
                    if verb in ("WATCH", "WATCHLIST", "CONNECT"):   # long-lived streams: their seconds are not work
                        continue
                    key = f'{verb} {res}{"/" + sub if sub else ""}'
                    out.setdefault(key, [0.0, 0.0])[i] += float(line.rsplit(" ", 1)[1])
        return out

    def lap(self, top: int = 12) -> dict[str, Any]:
        now = self._read()
        delta = {k: (v[0] - self.last.get(k, [0.0, 0.0])[0], v[1] - self.last.get(k, [0.0, 0.0])[1])
                 for k, v in now.items()}
        self.last = now
        busiest = sorted(((k, n, t) for k, (n, t) in delta.items() if n > 0), key=lambda x: -x[2])[:top]
        return {"requests": int(sum(n for n, _ in delta.values() if n > 0)),
                "seconds": round(sum(t for _, t in delta.values() if t > 0), 1),
                "by_verb_resource": {k: {"n": int(n), "s": round(t, 1)} for k, n, t in busiest}}


# ---------------------------------------------------------------- operator metrics
def _hist_parts(text: str, name: str) -> tuple[dict[float, float], float, float]:
    buckets: dict[float, float] = {}
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(name + "_count"):
            count += float(line.rsplit(" ", 1)[1])
    return buckets, total, count


def histogram(text: str, name: str, since: str = "") -> dict[str, float]:
    """p50/p99/mean/count of a Prometheus histogram from its exposition text (linear within a bucket), summed over
    its labels; with ``since`` (an earlier exposition) only what was observed after it."""
    now, total, count = _hist_parts(text, name)
    before, total0, count0 = _hist_parts(since, name)
    buckets = [(le, n - before.get(le, 0.0)) for le, n in now.items()]
    total, count = total - total0, count - count0

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


def api_requests(text: str, jobs: int) -> dict[str, Any]:
    """The operator's own account of the API requests it sent (``kubeforge_operator_api_requests_total``): by
    "verb resource", the total, and writes (every verb but get/list) per job."""
    name = "kubeforge_operator_api_requests_total{"
    by: dict[str, int] = {}
    for ln in text.splitlines():
        if ln.startswith(name):
            labels = dict(kv.split("=", 1) for kv in ln[len(name):ln.rindex("}")].split(",") if "=" in kv)
            key = f'{labels.get("verb", "").strip(chr(34))} {labels.get("resource", "").strip(chr(34))}'
            by[key] = by.get(key, 0) + int(float(ln.rsplit(" ", 1)[1]))
    writes = sum(n for k, n in by.items() if k.split(" ")[0] not in ("get", "list"))
    return {"total": sum(by.values()), "writes": writes, "writes_per_job": round(writes / max(jobs, 1), 2),
            "by_verb_resource": dict(sorted(by.items(), key=lambda kv: -kv[1]))}


# ---------------------------------------------------------------- where a job's start time goes
def _ts(text: str | None) -> float | None:
    if not text:
        return None
    import datetime as dt
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc).timestamp()


def _cond_time(pod: dict[str, Any], kind: str) -> float | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return _ts(c.get("lastTransitionTime"))
    return None


def start_breakdown(c: apply.Cluster, ns: str, label: str, owners: str | None) -> dict[str, Any]:
    """Per job, from the API objects' own timestamps (1 s resolution): owner created -> first StatefulSet
    (the operator), -> last pod created (controller-manager), -> last pod scheduled (scheduler), -> last pod Ready
    (kwok playing the kubelet). p50/p99 over jobs of each step, one paged LIST of each kind (one response of
    ~10,000 pods broke off mid-body on a loaded API server, and so did one of 1,000 RLJobs with their status)."""
    def items(api: str, kind: str, selector: str | None = label) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        query = {"limit": str(LIST_PAGE), **({"labelSelector": selector} if selector else {})}
        while True:
            page = c.request("GET", apply.path_of(api, kind, ns), query=query) or {}
            out.extend(page.get("items", []))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return out
            query = {**query, "continue": token}

    key = label.split("=")[0]
    jobs: dict[str, dict[str, float]] = {}
    if owners:
        for j in items(contract.API_VERSION, contract.KIND, None):
            t = _ts(j["metadata"].get("creationTimestamp"))
            if t is not None:
                jobs.setdefault(j["metadata"]["name"], {})["owner"] = t
    for s in items("apps/v1", "StatefulSet"):
        t = _ts(s["metadata"].get("creationTimestamp"))
        d = jobs.setdefault(s["metadata"]["labels"].get(key, ""), {})
        if t is not None:
            d["sts"] = min(d.get("sts", t), t)
    for p in items("v1", "Pod"):
        d = jobs.setdefault(p["metadata"]["labels"].get(key, ""), {})
        for name, t in (("pod", _ts(p["metadata"].get("creationTimestamp"))), ("scheduled", _cond_time(p, "PodScheduled")),
                        ("ready", _cond_time(p, "Ready"))):
            if t is not None:
                d[name] = max(d.get(name, t), t)
    steps = [("owner", "sts", "operator"), ("sts", "pod", "controller_manager"), ("pod", "scheduled", "scheduler"),
             ("scheduled", "ready", "kwok")]
    out: dict[str, Any] = {}
    for a, b, name in steps:
        xs = [d[b] - d[a] for d in jobs.values() if a in d and b in d]
        if xs:
            out[name + "_s"] = summary(xs)
    return out


# ---------------------------------------------------------------- phases
def log(msg: str) -> None:
    print(f"[bench-operator {time.strftime('%H:%M:%S')}] {msg} (load {os.getloadavg()[0]:.1f})", file=sys.stderr,
          flush=True)


def phase_result(done: dict[str, float], t0: float, goal: int, pods: int, timed_out: bool) -> dict[str, Any]:
    """Wall time to the last job ready (or to the give-up), per-job times, pods/s; partial when timed out."""
    end = time.monotonic() if timed_out or not done else max(done.values())
    out: dict[str, Any] = {"all_running_s" if not timed_out else "gave_up_after_s": round(end - t0, 1),
                           "jobs_ready": len(done), "jobs": goal,
                           "job_running_s": summary([t - t0 for t in done.values()]),
                           "pods_per_s": round(len(done) * pods / max(end - t0, 1e-3), 1)}
    return out


def wait_namespace_gone(k: harness.K, ns: str, timeout_s: float) -> float:
    """Delete ``ns`` and wait (bounded) until it is gone, so its teardown does not overlap the next phase."""
    t0 = time.monotonic()
    k.run("delete", "namespace", ns, "--wait=false", check=False)
    try:
        harness.wait(f"namespace {ns} gone", lambda: k.run("get", "namespace", ns, check=False).returncode != 0,
                     timeout_s=timeout_s, interval_s=2.0)
    except TimeoutError as exc:
        log(f"{exc}; going on")
    return round(time.monotonic() - t0, 1)


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
        out = phase_result(done, t0, jobs, want, watch.timed_out)
        out.update({"post_s": round(post_s, 1), "start_breakdown": start_breakdown(c, ns, BASE_LABEL, None),
                    "cpu_s": meter.lap()})
    finally:
        watch.close()
    out["teardown_s"] = wait_namespace_gone(k, ns, timeout_s)
    return out


def run_operator(out: dict[str, Any], c: apply.Cluster, k: harness.K, kubeconfig: str, tag: str, jobs: int, sizes: dict[str, int],
                 fail_fraction: float, timeout_s: float, recovery_timeout_s: float, meter: CpuMeter,
                 workers: int) -> None:
    """The operator phase and the recovery; fills ``out`` as figures come in (so a failure keeps them)."""
    ns = k.namespace(f"bench-op-{tag}")
    want = sum(sizes.values())
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="bench-operator-"))
    op = harness.Operator(kubeconfig=kubeconfig, log_path=logdir / "operator.log",
                          extra=("-n", ns, "--workers", str(workers)))
    watch = PodWatch(c, ns, contract.LABEL_JOB, want)
    out["log"] = str(logdir / "operator.log")
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
        # The operator's own account of the start, once it has seen as many jobs Running as the bench's watch did.
        start_metrics, start_wait_s = wait_recorded(op, name="kubeforge_operator_gang_running_seconds", want=len(done),
                                                    since="", timeout_s=RECORD_WAIT_S, first=op.metrics())
        pod_times = sorted(watch.first_running.values())
        out.update(phase_result(done, t0, jobs, want, watch.timed_out))
        if watch.low_memory:
            out["gave_up_because"] = f"available memory below {MIN_AVAILABLE_GIB} GiB"
        out.update({
            "post_s": round(post_s, 1), "pods_running": len(pod_times),
            "first_pod_running_s": round(pod_times[0] - t0, 1) if pod_times else None,
            "jobs_running_curve": watch.curve, "operator_record_wait_s": round(start_wait_s, 1),
            "cpu_s": meter.lap(),
            "reconcile_latency_s": histogram(start_metrics, "kubeforge_operator_reconcile_latency_seconds"),
            "reconcile_pass_s": histogram(start_metrics, "kubeforge_operator_reconcile_duration_seconds"),
            "reconciles": counter(start_metrics, "kubeforge_operator_reconciles_total"),
            "watch_events": counter(start_metrics, "kubeforge_operator_events_total"),
            "api_requests": api_requests(start_metrics, jobs),
            "status_writes_deferred": counter(start_metrics, "kubeforge_operator_status_writes_deferred_total"),
            "peak_rss_mib_after_start": round(op.peak_rss_kib() / 1024, 1),
        })
        try:   # last: one LIST of every pod, which an overloaded API server may not answer in time
            out["start_breakdown"] = start_breakdown(c, ns, contract.LABEL_JOB, "rljobs")
        except (apply.ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            out["start_breakdown"] = {"error": repr(exc)[:300]}
        log(f"{len(done)}/{jobs} jobs Running after {time.monotonic() - t0:.1f}s")
        if fail_fraction > 0 and not watch.timed_out:
            out["recovery"] = fail_and_recover(c, watch, ns, fail_fraction, recovery_timeout_s, meter)
        end_metrics = op.metrics()
        if "recovery" in out:
            end_metrics, waited_s = wait_recorded(op, name="kubeforge_operator_recovery_seconds",
                                                  want=out["recovery"]["jobs_recovered"], since=start_metrics,
                                                  timeout_s=RECORD_WAIT_S, first=end_metrics)
            out["recovery"].update({
                "operator_record_wait_s": round(waited_s, 1),
                "reconcile_latency_s": histogram(end_metrics, "kubeforge_operator_reconcile_latency_seconds",
                                                 since=start_metrics),
                "operator_decision_to_ready_s": histogram(end_metrics, "kubeforge_operator_recovery_seconds"),
                "errors": counter(end_metrics, "kubeforge_operator_reconcile_errors_total") -
                counter(start_metrics, "kubeforge_operator_reconcile_errors_total"),
            })
        out.update({
            "reconcile_latency_s_total": histogram(end_metrics, "kubeforge_operator_reconcile_latency_seconds"),
            "reconcile_pass_s_total": histogram(end_metrics, "kubeforge_operator_reconcile_duration_seconds"),
            "peak_rss_mib": round(op.peak_rss_kib() / 1024, 1), "operator_cpu_s": round(op.cpu_seconds(), 1),
            "errors": counter(end_metrics, "kubeforge_operator_reconcile_errors_total"),
            "pod_relist_failures": counter(end_metrics, "kubeforge_operator_pod_relist_failures_total"),
            "api_requests_total": api_requests(end_metrics, jobs),
        })
    finally:
        watch.close()
        op.stop()
        k.run("delete", "namespace", ns, "--wait=false", check=False)


def wait_recorded(op: harness.Operator, *, name: str, want: int, since: str, timeout_s: float,
                  first: str) -> tuple[str, float]:
    """The operator's metrics once histogram ``name`` has counted ``want`` observations after ``since`` (``first``
    is a read already made), or at ``timeout_s`` (the count then tells how many it recorded); and the seconds waited.
    The bench's watch and the operator see the same pod events, each in its own time: reading the operator's figure
    the moment the bench's own wait ends races the operator's pass that records it."""
    t0 = time.monotonic()
    text = first
    while histogram(text, name, since=since)["n"] < want and time.monotonic() - t0 < timeout_s:
        time.sleep(0.5)
        text = op.metrics()
    return text, time.monotonic() - t0


def fail_and_recover(c: apply.Cluster, watch: PodWatch, ns: str, fraction: float, timeout_s: float,
                     meter: CpuMeter) -> dict[str, Any]:
    running = sorted(watch.running_pods(), key=lambda s: s.name)
    hit = random.Random(0).sample(running, max(1, round(fraction * len(running))))
    attempts = watch.attempts()
    goal = {s.job: attempts[s.job] + 1 for s in hit}
    meter.lap()
    t0 = time.monotonic()

    def fail(s: PodState) -> PodState | None:
        try:
            c.request("PATCH", apply.path_of("v1", "Pod", ns, s.name), content_type="application/merge-patch+json",
                      body={"metadata": {"labels": {FAIL_LABEL: "true"},
                                         "annotations": {f"{FAIL_LABEL}/exit-code": "1",
                                                         f"{FAIL_LABEL}/reason": "Error"}}})
        except apply.ApiError as exc:
            if exc.status == 404:    # replaced since the watch saw it: not failed by the bench
                return None
            raise
        return s

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        hit = [s for s in ex.map(fail, hit) if s is not None]
    goal = {s.job: attempts[s.job] + 1 for s in hit}
    fail_s = time.monotonic() - t0
    log(f"failed {len(hit)} pods of {len(goal)} jobs in {fail_s:.1f}s; waiting for new attempts")
    done = watch.wait_jobs(goal, timeout_s=timeout_s, progress=lambda n: log(f"recovery: {n}/{len(goal)} jobs"))
    end = time.monotonic() if watch.timed_out or not done else max(done.values())
    log(f"{len(done)}/{len(goal)} hit jobs Running again after {end - t0:.1f}s")
    return {"pods_failed": len(hit), "jobs_hit": len(goal), "fail_patch_s": round(fail_s, 1),
            "jobs_recovered_curve": watch.curve, "jobs_recovered": len(done),
            "all_recovered_s" if not watch.timed_out else "gave_up_after_s": round(end - t0, 1),
            "job_recovered_s": summary([t - t0 for t in done.values()]), "cpu_s": meter.lap()}


def start_cluster(nodes: int, timeout_s: float) -> tuple[Any, Any]:
    from kfcluster import config as cfg
    from kfcluster import lifecycle
    pool = cfg.NodePool(count=nodes, gpus=8, zones=("zone-a", "zone-b"), racks_per_block=max(1, nodes // 40))
    env = cfg.from_env()
    config = cfg.from_env(
        name=os.environ.get("KF_CLUSTER_NAME") or "kf-bench-operator", nodes=(pool,), real_node=False,
        ready_timeout_s=max(120.0, nodes * 0.6), disable_qps_limits=True,
        kwok_pod_parallelism=env.kwok_pod_parallelism or 32,
        kwok_node_lease_parallelism=env.kwok_node_lease_parallelism or 16,
        extra_controller_manager_args={"concurrent-statefulset-syncs": "20", **env.extra_controller_manager_args})
    try:
        return lifecycle.up(config), config
    except BaseException:
        lifecycle.down(config=config, timeout_s=120)   # a half-started cluster leaves nothing behind
        raise


class Terminated(Exception):
    """SIGTERM arrived: raised in the main thread so the operator child, the namespace and the cluster are cleaned up
    by the ``finally`` blocks and the figures measured so far still print (a killed bench once left its operator
    process running)."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated(f"signal {signum}")


def main() -> int:
    signal.signal(signal.SIGTERM, _terminated)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=0, help="start a cluster with this many 8-GPU kwok nodes")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--pods-per-job", type=int, default=10)
    ap.add_argument("--fail-fraction", type=float, default=0.1)
    ap.add_argument("--baseline", action="store_true", help="also run the same pods without the operator first")
    ap.add_argument("--workers", type=int, default=16, help="the operator's --workers")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--timeout", type=float, default=1800, help="bound on the start wait (s); past it the bench "
                    "reports how many jobs got Running and skips the recovery")
    ap.add_argument("--recovery-timeout", type=float, default=900, help="bound on the recovery wait (s)")
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
        meter.api = ApiserverMeter(c)
        tag = uuid.uuid4().hex[:6]
        if a.baseline:
            log("baseline: plain StatefulSets + PodGroups, no operator")
            out["baseline_statefulsets_with_podgroup"] = run_baseline(c, k, tag, a.jobs, sizes, a.timeout, meter)
            log(f"baseline: {out['baseline_statefulsets_with_podgroup']}")
        log(f"operator: {a.jobs} RLJobs x {sum(sizes.values())} pods")
        out["operator"] = {}
        run_operator(out["operator"], c, k, kubeconfig, tag, a.jobs, sizes, a.fail_fraction, a.timeout,
                     a.recovery_timeout, meter, a.workers)
        out["control_plane_peak_rss_mib"] = {n: round(harness.peak_rss_kib(p) / 1024, 1)
                                             for n, p in control_plane_pids(workdir).items()}
    except Exception as exc:  # noqa: BLE001 - the figures measured so far still come out, with the error
        out["error"] = repr(exc)[:2000]
        log(f"bench failed: {exc!r}")
    else:
        if "baseline_statefulsets_with_podgroup" in out:
            b, o = out["baseline_statefulsets_with_podgroup"], out["operator"]
            if "all_running_s" in b and "all_running_s" in o:
                out["ratio_all_running_vs_baseline"] = round(o["all_running_s"] / b["all_running_s"], 2)
    finally:
        out["load_average"] = common.load_average()
        out["cpus"] = os.cpu_count()
        if config is not None and not a.keep_cluster:
            from kfcluster import lifecycle
            lifecycle.down(config=config, timeout_s=120)
    print(json.dumps(out))
    return 1 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
