"""The operator as users install it: ``helm install`` of the chart (helm/kubeforge) with the built operator image, in
a pod on the real node, under the chart's ServiceAccount and RBAC, in namespaced or in cluster-wide mode.

Role: the harness of the real-pod and Kueue suites (``run_real.run``, ``e2e/test_kueue_real.py``,
``e2e/test_two_nodes.py``, ``e2e/test_rbac.py``). ``install`` returns a ``Release`` once the operator pod is Ready
(``helm install --wait``); ``Release.uninstall`` removes it and waits until its pod is gone, so the session's next
operator never overlaps it. Host-process operators (``kfcluster.harness.Operator``) remain for the unit-speed
suites that need to kill or restart the process; each says why in its docstring.

```
 images/build.sh operator (cached by input hash; KF_IMPORT=1: ctr import into the real node's containerd)
 helm install <release> helm/kubeforge -n <release ns> --set image=<built> --set watchNamespaces={ns}|{} ...
   └─▶ ServiceAccount, ClusterRole cluster-reads, Role per watched namespace (or the ClusterRole), webhook,
       Deployment (nodeSelector + toleration of the real node) ──▶ Ready
 ... the suite's RLJobs ...
 Release.requests() ── the operator's kubeforge_operator_api_requests_total, scraped from its pod IP
 Release.uninstall() ── helm uninstall --wait; the release namespace deleted; the operator pod gone
```

Invariants: the CRD stays as the session's other suites expect it (``crds.install=false``: the suites apply
``crds/`` themselves); a namespace the suite made before the install keeps its own Pod Security labels (the chart
creates only absent watched namespaces); the role pods of real-pod suites still run the host's venv through
hostPath (``realjob``), so the runtime image is not needed here and is never built (only the operator image).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any

import realjob
from kfcluster import binaries, lifecycle
from node import realnode

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "kubeforge"
NAMESPACED, CLUSTER_WIDE = "namespaced", "cluster-wide"


def log(msg: str) -> None:
    print(f"[installed {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tool(name: str) -> str:
    path = binaries.bin_dir() / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is not built at {path} (e2e/build/build.sh {name})")
    return str(path)


def uv_env() -> dict[str, str]:
    """``KF_UV`` for images/build.sh where this checkout has no ``.venv`` (a git worktree): the running venv's uv."""
    uv = pathlib.Path(sys.prefix) / "bin" / "uv"
    return {"KF_UV": str(uv)} if not (ROOT / ".venv").is_dir() and uv.is_file() else {}


@functools.cache
def operator_image() -> str:
    """The operator image of this checkout (``images/build.sh operator``: rebuilt when its inputs changed), imported
    into the real node's containerd; its ref."""
    t0 = time.monotonic()
    run = subprocess.run(["bash", str(ROOT / "images" / "build.sh"), "operator"], capture_output=True, text=True,
                         timeout=3600, env={**os.environ, "KF_IMPORT": "1", **uv_env()})
    if run.returncode != 0:
        raise RuntimeError(f"images/build.sh operator failed:\n{run.stderr[-4000:]}")
    ref = run.stdout.split()[0]
    log(f"operator image {ref} ready in {time.monotonic() - t0:.1f}s")
    return ref


def helm_env(cluster: lifecycle.Cluster, home: pathlib.Path) -> dict[str, str]:
    return {**os.environ, "KUBECONFIG": cluster.kubeconfig,
            **{f"HELM_{d}_HOME": str(home / d.lower()) for d in ("CACHE", "CONFIG", "DATA")}}


def helm(cluster: lifecycle.Cluster, home: pathlib.Path, *args: str, timeout_s: float = 600,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([tool("helm"), *args], capture_output=True, text=True, timeout=timeout_s,
                         env=helm_env(cluster, home))
    if check and run.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args[:3])} ...: {run.stdout[-2000:]}{run.stderr[-3000:]}")
    return run


def esc(key: str) -> str:
    """A label key as one ``--set`` path element (its dots escaped)."""
    return key.replace(".", "\\.")


def values(*, image: str | None, watch: tuple[str, ...], on_real_node: bool, extra: tuple[str, ...] = ()) -> list[str]:
    """``--set`` arguments: the image (pulled never: imported into the node), the mode, the real node's selector and
    toleration; ``extra`` as given (``key=value``)."""
    sets = ["crds.install=false", *([f"watchNamespaces={{{','.join(watch)}}}"] if watch else []), *extra]
    strings: list[str] = []
    if image is not None:
        repo, tag = image.rsplit(":", 1)
        sets += [f"image.repository={repo}", f"image.tag={tag}", "image.pullPolicy=Never"]
    if on_real_node:
        sets += [f"tolerations[0].key={realnode.NODE_LABEL}", "tolerations[0].operator=Equal",
                 "tolerations[0].effect=NoSchedule"]
        # pinned to node 0 (a two-node suite loses node 1; node 0 hosts CoreDNS and the API server's address)
        strings += [f"nodeSelector.{esc(realnode.NODE_LABEL)}=true", "tolerations[0].value=true",
                    f"nodeSelector.{esc(realnode.HOSTNAME_LABEL)}={realnode.NODE_NAME}"]
    return [a for s in sets for a in ("--set", s)] + [a for s in strings for a in ("--set-string", s)]


@dataclasses.dataclass(kw_only=True)
class Release:
    """One installed release of the chart."""

    cluster: lifecycle.Cluster
    name: str
    namespace: str
    watch: tuple[str, ...]
    home: pathlib.Path
    install_s: float = 0.0

    @property
    def mode(self) -> str:
        return NAMESPACED if self.watch else CLUSTER_WIDE

    @property
    def account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}-kubeforge"

    def pods(self) -> list[dict[str, Any]]:
        got = self.cluster.kubectl.get_json("pods", "-n", self.namespace, "-l", f"app.kubernetes.io/instance={self.name}")
        return [p for p in got["items"] if not p["metadata"].get("deletionTimestamp")]

    def logs(self, *, tail: int = 200) -> str:
        run = self.cluster.kubectl.run("logs", "-n", self.namespace, "-l", f"app.kubernetes.io/instance={self.name}",
                                       f"--tail={tail}", "--prefix", check=False, timeout_s=60)
        return (run.stdout or "") + (run.stderr or "")

    def requests(self) -> dict[tuple[str, str], float]:
        """The operator's ``kubeforge_operator_api_requests_total`` by (verb, resource), from its pod's /metrics."""
        out: dict[tuple[str, str], float] = {}
        for pod in self.pods():
            ip = pod.get("status", {}).get("podIP")
            if not ip:
                continue
            with urllib.request.urlopen(f"http://{ip}:8080/metrics", timeout=10) as r:  # noqa: S310
                text = r.read().decode()
            for m in re.finditer(r'^kubeforge_operator_api_requests_total\{(.*?)\} ([0-9.e+]+)$', text, re.M):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
                key = (labels.get("verb", ""), labels.get("resource", ""))
                out[key] = out.get(key, 0.0) + float(m.group(2))
        return out

    def uninstall(self) -> None:
        """helm uninstall (also after a failed install: its webhook would refuse every RLJob), the release
        namespace deleted, and the operator pod gone."""
        helm(self.cluster, self.home, "uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout",
             "180s", check=False)
        k = self.cluster.kubectl
        k.run("delete", "namespace", self.namespace, "--wait=true", "--timeout=120s", check=False, timeout_s=150)


def undeclared(requests: dict[tuple[str, str], float]) -> list[tuple[str, str]]:
    """The (verb, resource) pairs of the operator's request counter that ``access.NEEDS`` does not grant (by
    resource name: the counter has no group), for a suite to assert empty after its run."""
    from kubeforge.operator import access

    verbs = {"apply": ("create", "patch")}
    bad = []
    for (verb, resource), n in sorted(requests.items()):
        if verb == "discover":
            continue    # API discovery: granted to every authenticated user (system:discovery)
        if n and not all(any(v in need.verbs and need.resource == resource for need in access.NEEDS)
                         for v in verbs.get(verb, (verb,))):
            bad.append((verb, resource))
    return bad


def install(cluster: lifecycle.Cluster, *, watch: tuple[str, ...], workdir: pathlib.Path, image: str | None = None,
            extra: tuple[str, ...] = (), wait: bool = True, on_real_node: bool = True,
            timeout_s: float = 300.0) -> Release:
    """``helm install`` the chart: namespaced mode over ``watch``, cluster-wide mode when it is empty. ``image``:
    the operator image (default: build and import this checkout's); ``wait``: until the operator pod is Ready."""
    if image is None and wait:
        image = operator_image()
    rel = Release(cluster=cluster, name=f"kf{uuid.uuid4().hex[:6]}", namespace=f"kf-sys-{uuid.uuid4().hex[:6]}",
                  watch=watch, home=workdir / "helm")
    rel.home.mkdir(parents=True, exist_ok=True)
    k = cluster.kubectl
    k.run("create", "namespace", rel.namespace)
    k.run("label", "namespace", rel.namespace, "pod-security.kubernetes.io/enforce=restricted")
    t0 = time.monotonic()
    try:
        helm(cluster, rel.home, "install", rel.name, str(CHART), "--namespace", rel.namespace,
             *values(image=image, watch=watch, on_real_node=on_real_node, extra=extra),
             *(["--wait", "--timeout", f"{int(timeout_s)}s"] if wait else []), timeout_s=timeout_s + 60)
    except Exception as exc:
        why = rel.logs(tail=60)
        describe = k.run("describe", "pods", "-n", rel.namespace, check=False, timeout_s=60).stdout[-4000:]
        rel.uninstall()
        raise RuntimeError(f"{exc}\n--- operator logs ---\n{why}\n--- pods ---\n{describe}") from None
    if wait and "webhook.enabled=false" not in extra:
        webhook_answers(cluster, namespace=next(iter(watch), "default"), timeout_s=timeout_s)
    rel.install_s = time.monotonic() - t0
    log(f"installed {rel.name} ({rel.mode}{': ' + ','.join(watch) if watch else ''}) in {rel.install_s:.1f}s")
    return rel


WEBHOOK_UNREACHED = "failed calling webhook"


def webhook_answers(cluster: lifecycle.Cluster, *, namespace: str, timeout_s: float) -> None:
    """Wait until the API server reaches the chart's admission webhook through its Service: a server-side dry run
    of a schema-valid RLJob comes back with anything but "failed calling webhook". ``helm install --wait`` returns
    when the operator pod is Ready, but the Service's ClusterIP routes only once kube-proxy has written the new
    endpoint's rules: an RLJob applied in between was refused with "connection refused" (a cold make test, load ~10)."""
    doc = realjob.load_tiny()
    doc["metadata"] = {"name": "kf-webhook-probe", "namespace": namespace}
    deadline = time.monotonic() + timeout_s
    while True:
        run = cluster.kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(doc), check=False)
        if WEBHOOK_UNREACHED not in run.stderr:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the admission webhook was not reachable through its Service in {timeout_s:.0f}s: "
                               f"{run.stderr.strip()[-500:]}")
        time.sleep(1.0)


def summary(rel: Release) -> dict[str, Any]:
    """What a suite prints about the operator it ran under."""
    return {"mode": rel.mode, "release": rel.name, "install_s": round(rel.install_s, 1), "account": rel.account}


__all__ = ["CLUSTER_WIDE", "NAMESPACED", "Release", "install", "operator_image", "summary", "undeclared"]
