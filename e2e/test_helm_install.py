"""The way users install it: `helm install` of the chart, the operator in a pod from the operator image, the tiny
RLJob to Succeeded in role pods from the CPU runtime image, in namespaces that enforce the `restricted` Pod
Security level, checkpoints on a local PersistentVolume, a real Prometheus scraping it all, then `helm upgrade`
(a value, the CRD) and `helm uninstall` (nothing of ours left).

One module, one RLJob run (a vLLM start in a pod costs a minute or two on 2 cores). Needs the real node
(``KUBEFORGE_REAL_NODE=1`` starts a cluster with it, as ``test_e2e_real``) and the images of ``make images``
(built here when missing: cached by input hash, so a warm run only imports them into the node's containerd).

```
 images/build.sh operator runtime ──▶ ctr import (real node)
 helm install (namespaced: watchNamespaces=[jobs]) ──▶ operator Deployment Ready on kf-real-0
 PV (local, kf-real-0) + StorageClass ◀── RLJob tiny (checkpoint.volumeClaimTemplate) ──▶ Succeeded
 prometheus (Debian) ── http_sd ◀ pods from the API ──▶ operator :8080, role pods :29500 ──▶ PromQL over HTTP
 helm upgrade --set workers=3 ; helm upgrade (chart with a changed CRD) ; helm uninstall ──▶ nothing left
```
"""
from __future__ import annotations

import http.server
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

import run_real
from kfcluster import binaries, lifecycle
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeforge"
STEPS = 10
ID = uuid.uuid4().hex[:5]
RELEASE = f"kf{ID}"
FULLNAME = f"{RELEASE}-kubeforge"
SYS_NS, JOBS_NS, OTHER_NS = f"kf-sys-{ID}", f"kf-jobs-{ID}", f"kf-other-{ID}"
STORAGE_CLASS = f"kubeforge-local-{ID}"
FIGURES: dict[str, Any] = {}


def log(msg: str) -> None:
    run_real.log(f"[helm] {msg}")


# ------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def images(cluster: lifecycle.Cluster) -> dict[str, str]:
    """``make images`` (cached): {name: ref}, imported into the real node's containerd."""
    t0 = time.monotonic()
    run = subprocess.run(["bash", str(ROOT / "images" / "build.sh"), "operator", "runtime"], capture_output=True,
                         text=True, timeout=3600, env={**os.environ, "KF_IMPORT": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    refs = {}
    for line in run.stdout.splitlines():
        ref, archive = line.split()
        name = ref.split("/")[-1].split(":")[0]
        refs[name] = ref
        FIGURES[f"{name}_archive_mib"] = round(os.path.getsize(archive) / 2**20)
    FIGURES["images_s"] = round(time.monotonic() - t0, 1)
    have = subprocess.run(["ctr", "--address", node_socket(), "-n", "k8s.io", "images", "ls", "-q"],
                          capture_output=True, text=True, check=True).stdout.split()
    for ref in refs.values():
        assert ref in have, f"{ref} not in the node's containerd: {have}"
    return refs


def node_socket() -> str:
    workdir = pathlib.Path("/run/kubeforge-node/workdir").read_text().strip()
    return f"{workdir}/node/containerd/containerd.sock"


def tool(name: str) -> str:
    path = binaries.bin_dir() / name
    assert path.is_file(), f"{name} is not built at {path} (e2e/build/build.sh {name})"
    return str(path)


class Env:
    """kubectl and helm against the cluster."""

    def __init__(self, cluster: lifecycle.Cluster, workdir: pathlib.Path) -> None:
        self.k = cluster.kubectl
        self.cluster = cluster
        self.workdir = workdir
        self.helm_env = {**os.environ, "KUBECONFIG": cluster.kubeconfig,
                         **{f"HELM_{d}_HOME": str(workdir / "helm" / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.k.run(*args, check=check, stdin=stdin, timeout_s=120)

    def helm(self, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        run = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=timeout_s,
                             env=self.helm_env)
        assert run.returncode == 0, f"helm {' '.join(args)}: {run.stdout[-2000:]}{run.stderr[-3000:]}"
        return run

    def get(self, *args: str) -> Any:
        return self.k.get_json(*args)

    def wait(self, what: str, probe: Any, *, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            last = probe()
            if last:
                return last
            time.sleep(1)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {str(last)[:500]})")


def operator_sets(images: dict[str, str], *extra: str) -> list[str]:
    repo, tag = images["operator"].rsplit(":", 1)
    sets = [f"image.repository={repo}", f"image.tag={tag}", "image.pullPolicy=Never",
            f"runtimeImage={images['runtime']}", f"watchNamespaces={{{JOBS_NS}}}", "crds.keep=false",
            f"tolerations[0].key={realnode.NODE_LABEL}", "tolerations[0].operator=Equal",
            "tolerations[0].effect=NoSchedule", *extra]
    strings = [f"nodeSelector.{realnode.NODE_LABEL.replace('.', chr(92) + '.')}=true", "tolerations[0].value=true"]
    return [a for s in sets for a in ("--set", s)] + [a for s in strings for a in ("--set-string", s)]


def operator_pods(env: Env) -> list[dict[str, Any]]:
    return [p for p in env.get("pods", "-n", SYS_NS, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
            if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions", []))


def adopt_crd(env: Env) -> None:
    """The session's other suites apply the CRD from crds/: mark it as the release's (Helm's adoption metadata), so
    the install takes it over instead of refusing, and no RLJob of anyone is lost."""
    for name in ("rljobs.kubeforge.dev", "generatorpools.kubeforge.dev"):
        if env.kubectl("get", "crd", name, check=False).returncode == 0:
            env.kubectl("annotate", "--overwrite", "crd", name, f"meta.helm.sh/release-name={RELEASE}",
                        f"meta.helm.sh/release-namespace={SYS_NS}")
            env.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")


def diagnose(env: Env) -> str:
    """The release's pods, their containers' states, recent events and logs: what a failed install leaves to read."""
    out = []
    for args in (("get", "pods", "-n", SYS_NS, "-o", "wide"),
                 ("describe", "pods", "-n", SYS_NS),
                 ("get", "events", "-n", SYS_NS, "--sort-by=.lastTimestamp"),
                 ("logs", "-n", SYS_NS, "-l", f"app.kubernetes.io/instance={RELEASE}", "--tail=60", "--all-containers",
                  "--prefix"),
                 ("get", "nodes", "-l", f"{realnode.NODE_LABEL}=true", "-o", "wide")):
        run = env.kubectl(*args, check=False)
        out.append(f"$ kubectl {' '.join(args)}\n{run.stdout[-6000:]}{run.stderr[-1000:]}")
    return "\n".join(out)


@pytest.fixture(scope="module")
def installed(cluster: lifecycle.Cluster, images: dict[str, str],
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    env = Env(cluster, tmp_path_factory.mktemp("helm-install"))
    for ns in (SYS_NS, JOBS_NS, OTHER_NS):
        env.kubectl("create", "namespace", ns)
        env.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted",
                    "pod-security.kubernetes.io/enforce-version=latest")
    adopt_crd(env)
    t0 = time.monotonic()
    try:
        try:
            env.helm("install", RELEASE, str(CHART), "--namespace", SYS_NS, *operator_sets(images), "--wait",
                     "--timeout", "300s")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- why the operator is not ready ---\n{diagnose(env)}") from None
        FIGURES["helm_install_to_operator_ready_s"] = round(time.monotonic() - t0, 1)
        log(f"installed {RELEASE} in {FIGURES['helm_install_to_operator_ready_s']} s")
        yield env
    finally:
        # also after a failed install: its webhook configuration would otherwise refuse every RLJob of the
        # session's other suites (the webhook's Service has no ready endpoint)
        subprocess.run([tool("helm"), "uninstall", RELEASE, "--namespace", SYS_NS, "--wait"], env=env.helm_env,
                       capture_output=True, timeout=300)
        env.kubectl("delete", "namespace", SYS_NS, JOBS_NS, OTHER_NS, "--wait=false", check=False)
        env.kubectl("delete", "pv", "-l", f"kubeforge.dev/e2e={ID}", "--wait=false", check=False)
        env.kubectl("delete", "storageclass", STORAGE_CLASS, check=False)
        # leave the CRD as the session's other suites expect it (they apply crds/ themselves too)
        for crd_file in ("kubeforge.dev_rljobs.yaml", "kubeforge.dev_generatorpools.yaml"):
            env.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds" / crd_file), check=False)


# ------------------------------------------------------------------------------------------- Prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """The Debian package's server, scraping the operator and the role pods found through the Kubernetes API.

    Debian's prometheus 2.42 is built without ``kubernetes_sd_configs`` (the config is refused: "field
    kubernetes_sd_configs not found"), so the suite discovers pods itself (``targets``: the selection of the chart's
    PodMonitor, pods listed from the API server) and hands them to Prometheus through ``http_sd_configs``."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.dir = env.workdir / "prometheus"
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_pods: dict[str, list[dict[str, Any]]] = {}
        self.seen: set[str] = set()   # every pod ever handed to Prometheus as a target (for failure messages)

    def targets(self) -> list[dict[str, Any]]:
        """Kubernetes pod discovery with the PodMonitor's selection: Running pods with a port named `metrics` of
        the release's operator (SYS_NS) and of every RLJob (label managed-by=kubeforge, JOBS_NS)."""
        groups = []
        for ns, selector, job in ((SYS_NS, f"app.kubernetes.io/instance={RELEASE}", "kubeforge-operator"),
                                  (JOBS_NS, "app.kubernetes.io/managed-by=kubeforge", "kubeforge-rljobs")):
            try:
                pods = self.env.get("pods", "-n", ns, "-l", selector)["items"]
                self.last_pods[ns] = pods
            except RuntimeError:   # a listing that failed under load keeps the last one (dropping it would drop targets)
                pods = self.last_pods.get(ns, [])
            for p in pods:
                ip = p.get("status", {}).get("podIP")
                if not ip or p["status"].get("phase") != "Running" or p["metadata"].get("deletionTimestamp"):
                    continue
                for c in p["spec"]["containers"]:
                    for port in c.get("ports", []):
                        if port.get("name") != "metrics":
                            continue
                        labels = {"job": job, "namespace": ns, "pod": p["metadata"]["name"]}
                        if "kubeforge.dev/job" in p["metadata"].get("labels", {}):
                            labels["rljob"] = p["metadata"]["labels"]["kubeforge.dev/job"]
                        groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": labels})
                        self.seen.add(p["metadata"]["name"])
        return groups

    def serve_discovery(self) -> str:
        """An http_sd endpoint answering ``targets()`` (Debian's prometheus is built without kubernetes_sd)."""
        outer = self
        self.found: list[dict[str, Any]] = []
        self.sd_stop = threading.Event()

        def refresh() -> None:   # kubectl is slow on a loaded machine: answer Prometheus from the last listing
            while not self.sd_stop.is_set():
                self.found = self.targets()
                self.sd_stop.wait(1.0)

        threading.Thread(target=refresh, daemon=True).start()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                body = json.dumps(outer.found).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.sd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.sd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.sd.server_address[1]}/targets"

    def config(self) -> dict[str, Any]:
        sd = [{"url": self.serve_discovery(), "refresh_interval": "2s"}]
        return {
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "5s"},
            "scrape_configs": [{"job_name": "kubeforge", "http_sd_configs": sd}],
        }

    def start(self) -> Prometheus:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is not installed (make host-deps: e2e/host/packages.txt)"
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(self.config()))
        self.log = open(self.dir / "prometheus.log", "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=2h"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.dir / "prometheus.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError("prometheus not ready in 60 s")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            doc = json.loads(exc.read())
        return doc

    def query(self, expr: str) -> list[dict[str, Any]]:
        doc = self.api("query", query=expr)
        assert doc["status"] == "success", f"{expr}: {doc}"
        return doc["data"]["result"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        if getattr(self, "sd", None) is not None:
            self.sd_stop.set()
            self.sd.shutdown()
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def prometheus(installed: Env) -> Iterator[Prometheus]:
    prom = Prometheus(installed).start()
    yield prom
    prom.stop()


# ------------------------------------------------------------------------------------------- the RLJob


def local_volume(env: Env) -> pathlib.Path:
    """A StorageClass without a provisioner and one local PersistentVolume on the real node."""
    path = env.workdir / "pv-checkpoints"
    path.mkdir()
    path.chmod(0o777)       # a local volume keeps the host directory's owner: the trainer runs as UID 1000
    docs = [
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS},
         "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"},
        {"apiVersion": "v1", "kind": "PersistentVolume",
         "metadata": {"name": f"kf-ckpt-{ID}", "labels": {"kubeforge.dev/e2e": ID}},
         "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                  "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS,
                  "local": {"path": str(path)},
                  "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                      {"key": "kubernetes.io/hostname", "operator": "In", "values": [realnode.NODE_NAME]}]}]}}}},
    ]
    env.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in docs))
    return path


def tiny_job() -> dict[str, Any]:
    """examples/quickstart.yaml (the first job the chart's NOTES.txt and docs/install.md give) as a user would run
    it here: on the real node, checkpoints on a claim per trainer."""
    doc = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    doc["metadata"] = {"name": "tiny", "namespace": JOBS_NS}
    spec = doc["spec"]
    spec["algorithm"]["steps"] = STEPS
    spec["checkpoint"] = {"path": "/checkpoints", "everySteps": 5,
                          "volumeClaimTemplate": {"storage": "1Gi", "storageClassName": STORAGE_CLASS}}
    for role in ("generator", "verifier", "trainer"):
        r = spec["roles"].setdefault(role, {})
        r["nodeSelector"] = {realnode.NODE_LABEL: "true"}
        r["tolerations"] = [dict(realnode.REAL_NODE_TOLERATION)]
    spec["roles"]["generator"]["enforceEager"] = True
    return doc  # type: ignore[no-any-return]


class JobRun:
    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.apply_to_running_s: float | None = None
        self.apply_to_succeeded_s: float | None = None
        self.pv_path: pathlib.Path | None = None
        self.pvcs: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def job(installed: Env, prometheus: Prometheus) -> JobRun:
    env, out = installed, JobRun()
    out.pv_path = local_volume(env)
    t0 = time.monotonic()
    env.kubectl("apply", "-f", "-", stdin=json.dumps(tiny_job()))
    deadline, last = t0 + 1200, None
    while time.monotonic() < deadline:
        st = env.get("rljob", "tiny", "-n", JOBS_NS).get("status") or {}
        for p in env.get("pods", "-n", JOBS_NS, "-l", "kubeforge.dev/job=tiny")["items"]:
            out.pods[p["metadata"]["uid"]] = p
        if out.pods and not out.pvcs:
            out.pvcs = env.get("pvc", "-n", JOBS_NS)["items"]
        phase = st.get("phase")
        if phase != last:
            log(f"phase {phase} at {time.monotonic() - t0:.1f}s (progress {st.get('progress')})")
            last = phase
        if phase == "Running" and out.apply_to_running_s is None:
            out.apply_to_running_s = round(time.monotonic() - t0, 1)
        if phase in ("Succeeded", "Failed"):
            out.status = st
            if phase == "Succeeded":
                out.apply_to_succeeded_s = round(time.monotonic() - t0, 1)
            break
        time.sleep(1)
    else:
        out.status = env.get("rljob", "tiny", "-n", JOBS_NS).get("status") or {}
    out.pvcs = env.get("pvc", "-n", JOBS_NS)["items"] or out.pvcs
    FIGURES.update(apply_to_running_s=out.apply_to_running_s, apply_to_succeeded_s=out.apply_to_succeeded_s)
    time.sleep(5)   # one more scrape of the operator after the transition
    return out


# ------------------------------------------------------------------------------------------- tests


def test_operator_runs_in_a_pod_from_the_operator_image(installed: Env, images: dict[str, str]) -> None:
    (pod,) = operator_pods(installed)
    assert ready(pod) and pod["spec"]["nodeName"] == realnode.NODE_NAME
    (c,) = pod["spec"]["containers"]
    assert c["image"] == images["operator"] and c["imagePullPolicy"] == "Never"
    assert pod["spec"]["serviceAccountName"] == FULLNAME
    assert not [v for v in pod["spec"].get("volumes", []) if "hostPath" in v]


def test_job_succeeds_in_runtime_image_pods_under_restricted(job: JobRun, images: dict[str, str]) -> None:
    print("HELM-E2E " + json.dumps(FIGURES))
    assert job.status.get("phase") == "Succeeded", json.dumps(job.status)[:2000]
    assert job.status["progress"]["step"] == STEPS
    assert {p["metadata"]["labels"]["kubeforge.dev/role"] for p in job.pods.values()} == {
        "generator", "verifier", "trainer"}
    for p in job.pods.values():
        spec = p["spec"]
        assert spec["nodeName"] == realnode.NODE_NAME
        assert [c["image"] for c in spec["containers"]] == [images["runtime"]]
        assert "command" not in spec["containers"][0], "the image's entrypoint (tini -- kubeforge) runs the role"
        assert not [v for v in spec["volumes"] if "hostPath" in v], "nothing of the host's Python or checkout"
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        assert spec["automountServiceAccountToken"] is (p["metadata"]["labels"]["kubeforge.dev/role"] == "trainer")


def test_jobs_namespace_enforces_restricted(installed: Env) -> None:
    """The API server refuses a pod the restricted level forbids there (so the role pods really passed it)."""
    labels = installed.get("namespace", JOBS_NS)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "root", "namespace": JOBS_NS},
           "spec": {"containers": [{"name": "c", "image": realnode.BASE_IMAGE}]}}
    run = installed.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(bad), check=False)
    assert run.returncode != 0 and "violates PodSecurity" in run.stderr, run.stderr


def test_checkpoints_on_the_local_persistent_volume(job: JobRun) -> None:
    (pvc,) = [c for c in job.pvcs if c["metadata"]["name"] == "checkpoints-tiny-trainer-0"]
    assert pvc["spec"]["storageClassName"] == STORAGE_CLASS and pvc["status"]["phase"] == "Bound"
    assert job.pv_path is not None
    names = sorted(p.name for p in job.pv_path.iterdir())
    assert f"step-{STEPS:09d}" in names, names


def test_network_policy_exists_for_the_job(installed: Env, job: JobRun) -> None:
    pol = installed.get("networkpolicy", "tiny-network", "-n", JOBS_NS)
    assert pol["spec"]["podSelector"] == {"matchLabels": {"kubeforge.dev/job": "tiny"}}


def can_i(env: Env, *args: str) -> bool:
    run = env.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:{SYS_NS}:{FULLNAME}", check=False)
    return run.stdout.strip() == "yes"


def test_operator_account_cannot_read_secrets_or_patch_pods_elsewhere(installed: Env) -> None:
    for ns in (JOBS_NS, SYS_NS, OTHER_NS, "default", "kube-system"):
        assert not can_i(installed, "get", "secrets", "-n", ns), ns
        assert not can_i(installed, "list", "secrets", "-n", ns), ns
    assert not can_i(installed, "list", "secrets", "--all-namespaces")
    for ns in (OTHER_NS, SYS_NS, "default", "kube-system"):
        assert not can_i(installed, "patch", "pods", "-n", ns), ns
    assert not can_i(installed, "patch", "pods", "--all-namespaces")
    # what it must hold to grant it to its jobs' runtime Role (RBAC grants only what one holds)
    assert can_i(installed, "patch", "pods", "-n", JOBS_NS)
    assert can_i(installed, "create", "networkpolicies", "-n", JOBS_NS)


def series(prom: Prometheus, expr: str) -> list[dict[str, Any]]:
    return prom.query(expr)


def test_prometheus_scraped_rl_and_operator_series(prometheus: Prometheus, job: JobRun) -> None:
    sel = f'namespace="{JOBS_NS}", rljob="tiny"'
    window = "[30m]"
    out: dict[str, Any] = {}
    reward = series(prometheus, f'last_over_time(kubeforge_reward_mean{{{sel}, role="trainer"}}{window})')
    assert reward and 0.0 <= float(reward[0]["value"][1]) <= 1.0, reward
    out["reward_mean_last"] = float(reward[0]["value"][1])
    step = series(prometheus, f'max_over_time(kubeforge_step{{{sel}, role="trainer"}}{window})')
    assert step and 1 <= float(step[0]["value"][1]) <= STEPS, step
    out["step_max"] = float(step[0]["value"][1])
    phases = series(prometheus, f'sum by (phase) (max_over_time(kubeforge_phase_seconds_count{{{sel}}}{window}))')
    assert phases, "no step phase timings"
    step_time = series(prometheus, f'sum(max_over_time(kubeforge_phase_seconds_sum{{{sel}, role="trainer"}}{window}))'
                                   f' / sum(max_over_time(kubeforge_phase_seconds_count{{{sel}, role="trainer"}}{window}))')
    assert step_time and 0 < float(step_time[0]["value"][1]) < 600, step_time
    out["trainer_phase_mean_s"] = round(float(step_time[0]["value"][1]), 3)
    # the trainer pushes, the generator receives; the verifier takes no part (count 0: left out by `> 0`)
    sync = series(prometheus, f'sum by (role) (max_over_time(kubeforge_weight_sync_seconds_sum{{{sel}}}{window})) / '
                              f'(sum by (role) (max_over_time(kubeforge_weight_sync_seconds_count{{{sel}}}{window})) > 0)')
    assert {s["metric"]["role"] for s in sync} == {"trainer", "generator"}, sync
    assert all(0 < float(s["value"][1]) < 120 for s in sync), sync
    out["weight_sync_mean_s"] = {s["metric"].get("role"): round(float(s["value"][1]), 4) for s in sync}
    recs = series(prometheus, f'kubeforge_operator_reconciles_total{{namespace="{SYS_NS}"}}')
    assert recs and sum(float(s["value"][1]) for s in recs) >= 3, recs
    out["operator_reconciles"] = sum(float(s["value"][1]) for s in recs)
    succeeded = series(prometheus, f'kubeforge_operator_rljobs{{namespace="{SYS_NS}", phase="Succeeded"}}')
    assert succeeded and float(succeeded[0]["value"][1]) == 1.0, succeeded
    targets = prometheus.api("targets")["data"]["activeTargets"]
    out["targets_seen"] = sorted({t["labels"].get("job", "") for t in targets})
    FIGURES["promql"] = out
    print("HELM-E2E-PROMQL " + json.dumps(out))


#: Families that exist only after an event this run does not cause (a failure, a drop, a verifier error): their
#: counters are labelled, so no sample exists until the first one.
EVENT_ONLY = {"kubeforge_operator_failures_total", "kubeforge_operator_recovery_seconds_bucket",
              "kubeforge_operator_reconcile_errors_total",   # a pass that raised (none in a clean run)
              "kubeforge_rollouts_dropped_total", "kubeforge_verifier_errors_total",
              "kubeforge_verifier_fallbacks_total",
              "kubeforge_env_failures_total",                # an environment that failed an episode (by kind)
              # the agents endpoint runs only in jobs whose environment drives it (type Verifiers); this job has none
              "kubeforge_endpoint_requests_total", "kubeforge_endpoint_refusals_total",
              "kubeforge_endpoint_branches_total", "kubeforge_endpoint_tokens_total",
              "kubeforge_endpoint_request_seconds_bucket", "kubeforge_endpoint_first_token_seconds_bucket",
              "kubeforge_endpoint_tool_parses_total",
              # a GeneratorPool's engine, by attached job: this job runs its own generators, no pool
              "kubeforge_pool_engine_seconds_total", "kubeforge_pool_completions_total",
              "kubeforge_pool_queue_wait_seconds_bucket", "kubeforge_pool_adapter_swaps_total",
              "kubeforge_pool_adapter_swap_seconds_bucket",
              # groups dropped for an episode lost with its environment server (none in a clean run)
              "kubeforge_infra_masked_rollouts_total",
              # sandbox pods run only in jobs with spec.sandbox (docs/sandboxes.md); this job has none
              "kubeforge_sandbox_claims_total", "kubeforge_sandbox_runs_total", "kubeforge_sandbox_resets_total",
              "kubeforge_sandbox_refusals_total", "kubeforge_sandbox_leases", "kubeforge_sandbox_run_seconds_bucket"}


def test_every_dashboard_query_parses_and_names_a_real_series(prometheus: Prometheus, job: JobRun) -> None:
    dash = json.loads((CHART / "dashboards" / "kubeforge.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    # the variables' label_values(EXPR, LABEL) is Grafana's; Prometheus answers the same as group by (LABEL) (EXPR)
    exprs += [re.sub(r"label_values\((.*), (\w+)\)", r"group by (\2) (\1)", v["query"]["query"])
              for v in dash["templating"]["list"] if v["type"] == "query"]
    held = set(prometheus.api("label/__name__/values")["data"])
    missing: dict[str, list[str]] = {}
    for expr in exprs:
        e = expr.replace("$namespace", JOBS_NS).replace("$rljob", "tiny")
        doc = prometheus.api("query", query=e)
        assert doc["status"] == "success", f"does not parse: {expr}: {doc.get('error')}"
        for name in re.findall(r"\b(kubeforge_\w+)", e):
            if name not in held:
                missing.setdefault(name, []).append(expr)
    up = {r["metric"].get("pod", ""): r["value"][1] for r in prometheus.api("query", query="up")["data"]["result"]}
    assert set(missing) <= EVENT_ONLY, ({k: v[:1] for k, v in missing.items() if k not in EVENT_ONLY},
                                        f"targets ever discovered: {sorted(prometheus.seen)}; up now: {up}")
    FIGURES["dashboard"] = {"queries": len(exprs), "event_only_absent": sorted(missing)}


def test_helm_upgrade_changes_a_value(installed: Env, images: dict[str, str], job: JobRun) -> None:
    t0 = time.monotonic()
    installed.helm("upgrade", RELEASE, str(CHART), "--namespace", SYS_NS, *operator_sets(images, "workers=3"),
                   "--wait", "--timeout", "300s")
    pods = installed.wait("the upgraded operator Ready", lambda: [
        p for p in operator_pods(installed) if ready(p) and "--workers=3" in p["spec"]["containers"][0]["args"]]
        and len(operator_pods(installed)) == 1 and operator_pods(installed), timeout_s=180)
    FIGURES["helm_upgrade_value_s"] = round(time.monotonic() - t0, 1)
    assert "--workers=3" in pods[0]["spec"]["containers"][0]["args"]


def test_helm_upgrade_changes_the_crd(installed: Env, images: dict[str, str], job: JobRun,
                                      tmp_path: pathlib.Path) -> None:
    chart = tmp_path / "kubeforge"
    shutil.copytree(CHART, chart)
    crd_file = chart / "files" / "crds" / "kubeforge.dev_rljobs.yaml"
    text = crd_file.read_text()
    doc = yaml.safe_load(text)
    cols = doc["spec"]["versions"][0]["additionalPrinterColumns"]
    assert not any(c["name"] == "Attempt" for c in cols)
    m = re.search(r"^( *)additionalPrinterColumns:\n", text, re.M)
    assert m, "no additionalPrinterColumns in the CRD file"
    crd_file.write_text(text[:m.end()] + f"{m.group(1)}- {{name: Attempt, type: integer, jsonPath: .status.attempt, "
                        "description: Restart attempt.}\n" + text[m.end():])
    (chart / "Chart.yaml").write_text((chart / "Chart.yaml").read_text().replace("version: 0.1.0", "version: 0.1.1"))
    installed.helm("upgrade", RELEASE, str(chart), "--namespace", SYS_NS, *operator_sets(images, "workers=3"),
                   "--wait", "--timeout", "300s")
    got = installed.get("crd", "rljobs.kubeforge.dev")
    assert any(c["name"] == "Attempt" for c in got["spec"]["versions"][0]["additionalPrinterColumns"])
    assert got["metadata"]["labels"]["helm.sh/chart"] == "kubeforge-0.1.1"
    # the existing RLJob survived the schema change
    assert installed.get("rljob", "tiny", "-n", JOBS_NS)["status"]["phase"] == "Succeeded"


def lease_holder(env: Env) -> str:
    """The holder identity (``<pod>_<random>``: one per operator process), "" when there is no Lease."""
    run = env.kubectl("get", "lease", FULLNAME, "-n", SYS_NS, "-o", "json", check=False)
    return str(json.loads(run.stdout)["spec"].get("holderIdentity") or "") if run.returncode == 0 else ""


def pod_of(holder: str) -> str:
    return holder.rsplit("_", 1)[0]


def webhook_ca(env: Env) -> str:
    import base64
    secret = env.get("secret", f"{FULLNAME}-webhook-tls", "-n", SYS_NS)
    return base64.b64decode(secret["data"]["ca.crt"]).decode()


def review_directly(pod: dict[str, Any], ca: str, obj: dict[str, Any]) -> dict[str, Any]:
    """POST an AdmissionReview to one operator pod's webhook port (pod IP, the chart's CA)."""
    import http.client
    import ssl
    ctx = ssl.create_default_context(cadata=ca)
    ctx.check_hostname = False          # the certificate names the Service, we dial the pod's IP
    conn = http.client.HTTPSConnection(pod["status"]["podIP"], 9443, context=ctx, timeout=20)
    try:
        conn.request("POST", "/validate.rljobs", body=json.dumps({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()), "operation": "CREATE", "object": obj}}),
            headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()[:500]
        return json.loads(resp.read())["response"]  # type: ignore[no-any-return]
    finally:
        conn.close()


def invalid_job() -> dict[str, Any]:
    doc = tiny_job()
    doc["metadata"] = {"name": "bad", "namespace": JOBS_NS}
    doc["spec"]["algorithm"]["temperature"] = 0   # schema-valid, refused by the review (greedy sampling)
    return doc


def test_two_replicas_one_active_and_a_killed_leader_is_replaced(installed: Env, images: dict[str, str],
                                                                  job: JobRun, prometheus: Prometheus) -> None:
    installed.helm("upgrade", RELEASE, str(CHART), "--namespace", SYS_NS,
                   *operator_sets(images, "workers=3", "replicas=2"), "--wait", "--timeout", "300s")
    pods = installed.wait("two operator pods Ready", lambda: (ps := operator_pods(installed)) and len(ps) == 2
                          and all(ready(p) for p in ps) and ps, timeout_s=240)
    names = {p["metadata"]["name"] for p in pods}
    holder = installed.wait("a lease holder", lambda: pod_of(h := lease_holder(installed)) in names and h,
                            timeout_s=60)
    leader = pod_of(holder)
    # both replicas answer admission reviews (the Service may route to either); the API server path too
    ca = webhook_ca(installed)
    for p in pods:
        answer = review_directly(p, ca, invalid_job())
        assert answer["allowed"] is False and "greedy sampling" in answer["status"]["message"], (p["metadata"]["name"],
                                                                                           answer)
        assert review_directly(p, ca, tiny_job())["allowed"] is True
    for _ in range(6):
        run = installed.kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(invalid_job()), check=False)
        assert run.returncode != 0 and "denied the request" in run.stderr and "greedy" in run.stderr, run.stderr
    # one active: the operators' own gauge, scraped by Prometheus from both pods
    # (only the two current pods' series count: the rolled-away pod's last sample, 1 while it led, stays queryable
    # until Prometheus marks it stale, which made a one-shot check here see two leaders in the fresh-clone run)
    def current(pod_names: set[str]) -> list[dict[str, Any]]:
        r = prometheus.query(f'kubeforge_operator_leader{{namespace="{SYS_NS}"}}')
        return [x for x in r if x["metric"].get("pod") in pod_names]

    active = installed.wait("both operators scraped, exactly one active", lambda: len(c := current(names)) == 2
                            and sorted(float(x["value"][1]) for x in c) == [0.0, 1.0] and c, timeout_s=90)
    assert {r["metric"]["pod"] for r in active if float(r["value"][1]) == 1.0} == {leader}
    # crash the leader (SIGKILL of the operator process: no release) and time the takeover
    t0 = time.monotonic()
    installed.kubectl("exec", "-n", SYS_NS, leader, "--", "python", "-c",
                      "import os; [os.kill(int(p), 9) for p in os.listdir('/proc') "
                      "if p.isdigit() and int(p) not in (1, os.getpid())]", check=False)
    new = installed.wait("another process holds the lease",
                         lambda: (h := lease_holder(installed)) and h != holder and h, timeout_s=60)
    FIGURES["leader_takeover_s"] = round(time.monotonic() - t0, 1)
    FIGURES["leader_takeover_by"] = "standby" if pod_of(new) != leader else "the killed leader's restarted process"
    log(f"{new} took over from {holder} in {FIGURES['leader_takeover_s']} s ({FIGURES['leader_takeover_by']})")
    assert pod_of(new) in names
    assert FIGURES["leader_takeover_s"] < 30
    # the crashed leader's container restarted; the Lease stays with the new holder, and one replica is active
    installed.wait("the old leader restarted", lambda: any(
        p["metadata"]["name"] == leader and p["status"]["containerStatuses"][0].get("restartCount", 0) >= 1
        for p in operator_pods(installed)), timeout_s=90)
    installed.wait("two operators scraped again, exactly one active", lambda: len(c := current(names)) == 2
                   and sorted(float(x["value"][1]) for x in c) == [0.0, 1.0], timeout_s=90)
    assert lease_holder(installed) == new
    print("HELM-E2E-HA " + json.dumps({k: FIGURES[k] for k in ("leader_takeover_s", "leader_takeover_by")}))


def test_helm_uninstall_leaves_nothing(installed: Env, job: JobRun) -> None:
    installed.helm("uninstall", RELEASE, "--namespace", SYS_NS, "--wait", "--timeout", "300s")
    left: list[str] = []
    sel = f"app.kubernetes.io/instance={RELEASE}"
    for kind in ("clusterroles", "clusterrolebindings", "customresourcedefinitions"):
        left += [f"{kind}/{o['metadata']['name']}" for o in installed.get(kind, "-l", sel)["items"]]
    for ns in (SYS_NS, JOBS_NS):
        for kind in ("deployments", "serviceaccounts", "services", "configmaps", "roles", "rolebindings", "leases"):
            left += [f"{ns}/{kind}/{o['metadata']['name']}" for o in installed.get(kind, "-n", ns, "-l", sel)["items"]]
    assert not left, left
    assert installed.kubectl("get", "crd", "rljobs.kubeforge.dev", check=False).returncode != 0
    installed.wait("operator pods gone", lambda: not operator_pods(installed), timeout_s=120)


def test_helm_uninstall_leaves_no_lease(installed: Env, job: JobRun) -> None:
    # the last leader deletes its Lease on SIGTERM (and the Lease is owned by its pod: the garbage collector
    # removes one nobody released); helm does not wait for the pods, so neither can we at once
    t0 = time.monotonic()
    installed.wait("the Lease gone", lambda: installed.kubectl("get", "lease", FULLNAME, "-n", SYS_NS,
                                                               check=False).returncode != 0, timeout_s=60)
    FIGURES["lease_gone_after_uninstall_s"] = round(time.monotonic() - t0, 1)
    print("HELM-E2E-UNINSTALL " + json.dumps({"lease_gone_after_uninstall_s": FIGURES["lease_gone_after_uninstall_s"]}))
    # the RLJob went with its CRD, and its children (owner references) with it
    installed.wait("the job's children gone", lambda: not any(
        installed.get(kind, "-n", JOBS_NS, "-l", "kubeforge.dev/job=tiny")["items"]
        for kind in ("statefulsets", "services", "configmaps", "networkpolicies", "pods", "pvc", "serviceaccounts")),
        timeout_s=120)
