"""Kueue's manager on the test control plane: a host process beside the scheduler (``make cluster-up KUEUE=1``,
or ``start(cluster)`` on a running cluster, e.g. from the ``kueue_cluster`` fixture).

Role: install Kueue's CRDs (from its module zip, copied by ``e2e/build/build.sh kueue`` into
``share/crds/kueue/``), write its Configuration and serving certificates under ``<workdir>/kwok/kueue/``, start
``kueue`` and wait until it answers ``/readyz``. Neighbours: ``lifecycle`` (up starts it through ``start``; down stops
it: the process names ``<workdir>/kwok`` on its command line), ``record`` (the cluster's record, which ``start``
extends with Kueue's ports), ``binaries`` (the build). Imports no ``lifecycle``: that one imports this module.

Choices (docs/test-cluster.md "Kueue"):
- Kueue's webhooks are served (on a self-signed certificate for 127.0.0.1 made here) but **not registered** with
  the API server: nothing calls them. Its CRDs carry OpenAPI defaults; clients (the operator, tests) write
  complete ``kueue.x-k8s.io/v1beta2`` objects (the storage version; the CRDs have no conversion webhook here, so
  only v1beta2 is used).
- ``internalCertManagement`` is off: it stores certificates in a Secret for a kubelet to mount, which a host
  process never sees. With it off Kueue reads its metrics certificate from the fixed path
  ``/etc/kueue/metrics/certs`` (hard-coded in v0.17's ``cmd/kueue/main.go``, no flag or setting). So the manager
  runs in a private mount namespace (``unshare --mount``) whose ``/etc`` is an overlay: the host's ``/etc`` below,
  ``<workdir>/kwok/kueue/etc`` above, where the self-signed metrics certificate is written. The host's ``/etc`` is
  never written; ``down`` removes the work dir and with it the certificate, and the namespace ends with the
  process (nothing stays mounted on the host).
- Only the ``batch/job`` integration is on, leader election off, the visibility API server off.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import time
import urllib.request
from typing import Any

from kfcluster import binaries, kube, procs
from kfcluster.record import Cluster, log

NAMESPACE = "kueue-system"
API_VERSION = "kueue.x-k8s.io/v1beta2"
METRICS_CERT_DIR = pathlib.Path("/etc/kueue/metrics/certs")   # as the manager sees it (its private /etc)
PORT_NAMES = ("kueue-health", "kueue-metrics", "kueue-webhook")
READY_TIMEOUT_S = 90.0


def crd_dir() -> pathlib.Path:
    return binaries.cache_dir() / "share" / "crds" / "kueue"


def config(*, ports: dict[str, int], cert_dir: str) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for a host process bound to loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue-health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue-metrics']}"},
        "webhook": {"port": ports["kueue-webhook"], "host": "127.0.0.1", "certDir": cert_dir},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 50, "burst": 100},
        "featureGates": {"VisibilityOnDemand": False},
    }


def _self_signed(dir_: pathlib.Path, *, cn: str) -> None:
    """``tls.crt``/``tls.key`` in ``dir_`` (self-signed, 127.0.0.1 and localhost), written atomically."""
    dir_.mkdir(parents=True, exist_ok=True)
    tmp = dir_ / f".tmp.{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", f"/CN={cn}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(tmp / "tls.key"), "-out", str(tmp / "tls.crt")],
                   check=True, capture_output=True, timeout=60)
    for name in ("tls.key", "tls.crt"):
        os.replace(tmp / name, dir_ / name)
    tmp.rmdir()


def etc_overlay(home: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The upper and work directories of the manager's private ``/etc`` overlay under ``home``."""
    return home / "etc", home / "etc-work"


def isolated_command(argv: list[str], *, home: pathlib.Path) -> list[str]:
    """``argv`` run in a private mount namespace whose ``/etc`` is the host's with ``<home>/etc`` laid over it (the
    metrics certificate's fixed path lands in the work dir). ``exec`` keeps the pid and the command line (which
    names the work dir: ``down`` finds it). Not root: a user namespace maps the caller to root for the mount."""
    upper, work = etc_overlay(home)
    script = ('mount -t overlay kueue-etc -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && shift 2 && '
              'exec "$@"')
    userns = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *userns, "--mount", "--propagation", "private", "sh", "-c", script, "kueue-etc",
            str(upper), str(work), *argv]


def _metrics_cert(home: pathlib.Path) -> None:
    """The metrics certificate at ``/etc/kueue/metrics/certs`` as the manager sees it: in the overlay's upper dir."""
    upper, work = etc_overlay(home)
    work.mkdir(parents=True, exist_ok=True)
    _self_signed(upper / METRICS_CERT_DIR.relative_to("/etc"), cn="kueue-metrics")


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:  # noqa: S310
            return bool(resp.status == 200)
    except OSError:
        return False


def running(cluster: Cluster) -> bool:
    port = cluster.ports.get("kueue-health")
    return port is not None and _ready(port)


def start(cluster: Cluster, *, timeout_s: float = READY_TIMEOUT_S) -> Cluster:
    """Start Kueue in ``cluster`` (idempotent: a Kueue answering on the recorded port is kept)."""
    if running(cluster):
        return cluster
    t0 = time.monotonic()
    bins = binaries.require(["kueue"])
    crds = sorted(crd_dir().glob("*.yaml"))
    if not crds:
        raise FileNotFoundError(f"no Kueue CRDs in {crd_dir()}: run e2e/build/build.sh kueue")
    k = cluster.kubectl
    for path in crds:
        k.run("apply", "--server-side", "-f", str(path))
    kube.wait_for("Kueue CRDs Established", lambda: all(k.run(
        "get", f"crd/{p.stem.split('_', 1)[1]}.{p.stem.split('_', 1)[0]}", "-o",
        "jsonpath={.status.conditions[?(@.type==\"Established\")].status}", check=False).stdout.strip() == "True"
        for p in crds), timeout_s=60)
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    home = pathlib.Path(cluster.kwok_dir) / "kueue"    # under <workdir>/kwok: ``down`` stops what names it
    cert_dir = home / "certs"
    _self_signed(cert_dir, cn="kueue-webhook")
    _metrics_cert(home)
    ports = dict(zip(PORT_NAMES, procs.free_ports(len(PORT_NAMES)), strict=True))
    cfg_path = home / "config.yaml"
    cfg_path.write_text(json.dumps(config(ports=ports, cert_dir=str(cert_dir)), indent=2) + "\n")
    kubeconfig = pathlib.Path(cluster.kwok_dir) / "clusters" / cluster.name / "kubeconfig.yaml"
    log_path = home / "kueue.log"
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(isolated_command([bins["kueue"], f"--config={cfg_path}", f"--kubeconfig={kubeconfig}",
                                                  "--zap-log-level=2"], home=home), stdout=log_file,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    (home / "kueue.pid").write_text(str(proc.pid))

    def up() -> bool | None:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").splitlines()[-10:]
            raise RuntimeError(f"kueue exited with {proc.returncode}:\n" + "\n".join(tail))
        return _ready(ports["kueue-health"]) or None

    kube.wait_for("kueue /readyz", up, timeout_s=timeout_s, interval_s=0.5)
    updated = dataclasses.replace(cluster, ports={**cluster.ports, **ports}, kueue=True)
    updated.save()
    log(f"kueue {binaries.versions()['KUEUE_VERSION']} ready in {time.monotonic() - t0:.1f}s (log {log_path})")
    return updated


__all__ = ["API_VERSION", "NAMESPACE", "config", "etc_overlay", "isolated_command", "running", "start"]
