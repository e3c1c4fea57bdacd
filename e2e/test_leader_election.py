"""Two operators, one active (``--leader-elect``), against the real kube-apiserver: processes on the host, as the
chart's replicas would run (``e2e/test_helm_install.py`` does the same with pods on the real node). Processes,
because the suite signals each operator itself (SIGKILL, SIGTERM) and starts one again under the same pod name at a
moment it chooses, and its kwok-tier cluster has no node that runs containers.

```
 A holds the Lease ── SIGKILL A ──▶ B takes over when A's Lease expires     (takeover time: LEADER-E2E line)
 A restarted (same pod name) ──▶ stands by: a new process is a new identity, it cannot renew the dead one's Lease
 SIGTERM B ──▶ B deletes its Lease ──▶ A takes over at once ── SIGTERM A ──▶ no Lease left
```
"""
from __future__ import annotations

import json
import pathlib
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kfcluster import harness
from kfcluster.harness import wait

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]
LEASE = "kubeforge-operator-e2e"


class Candidate(harness.Operator):
    """An operator process posing as pod ``pod`` (the identity's prefix) of the release."""

    def __init__(self, pod: str, ns: str, kubeconfig: str, log_dir: pathlib.Path) -> None:
        super().__init__(kubeconfig=kubeconfig, log_path=log_dir / f"{pod}.log",
                         extra=("--namespace", ns, "--no-webhook", "--leader-elect", "--leader-namespace", ns,
                                "--leader-lease", LEASE), env={"POD_NAME": pod})   # the chart sets it from the pod
        self.pod = pod

    def start(self, *, timeout_s: float = 60.0) -> Candidate:
        super().start(timeout_s=timeout_s)
        return self

    def active(self) -> float:
        m = re.search(r"^kubeforge_operator_leader (\S+)$", self.metrics(), re.M)
        assert m, "no kubeforge_operator_leader series"
        return float(m.group(1))


@pytest.fixture()
def ns(kube_cluster: Any) -> Iterator[tuple[harness.K, str]]:
    k = harness.K(kubectl=kube_cluster.kubectl.binary, kubeconfig=kube_cluster.kubeconfig)
    k.ensure_crd()
    name = k.namespace(f"lease-{uuid.uuid4().hex[:6]}")
    yield k, name
    k.run("delete", "namespace", name, "--wait=false", check=False)


def holder(k: harness.K, ns: str) -> str:
    run = k.run("get", "lease", LEASE, "-n", ns, "-o", "json", check=False)
    return str(json.loads(run.stdout)["spec"].get("holderIdentity") or "") if run.returncode == 0 else ""


def test_one_active_takeover_after_sigkill_and_handover_on_sigterm(
        kube_cluster: Any, ns: tuple[harness.K, str], tmp_path: pathlib.Path) -> None:
    k, name = ns
    a = Candidate("op-a", name, kube_cluster.kubeconfig, tmp_path).start()
    procs = [a]
    try:
        first = wait("A holds the Lease", lambda: (h := holder(k, name)).startswith("op-a_") and h, timeout_s=60)
        b = Candidate("op-b", name, kube_cluster.kubeconfig, tmp_path).start()
        procs.append(b)
        wait("A active, B standing by", lambda: a.active() == 1 and b.active() == 0, timeout_s=30)
        # crash: no release; B takes the Lease when it expires (6 s after A's last renewal)
        t0 = time.monotonic()
        a.kill()
        second = wait("B holds the Lease", lambda: (h := holder(k, name)).startswith("op-b_") and h, timeout_s=60)
        takeover_s = round(time.monotonic() - t0, 1)
        wait("B active", lambda: b.active() == 1, timeout_s=30)
        # A's pod restarts its container: same pod name, new process, new identity: it stands by
        a2 = Candidate("op-a", name, kube_cluster.kubeconfig, tmp_path).start()
        procs.append(a2)
        time.sleep(3)   # three of its tries (every 1 s): the restarted process must not take B's live Lease
        assert holder(k, name) == second and a2.active() == 0 and b.active() == 1
        assert first != holder(k, name)
        # graceful stop: B deletes its Lease, A takes over at once (no wait for an expiry)
        t0 = time.monotonic()
        assert b.proc is not None
        b.proc.terminate()
        assert b.proc.wait(30) == 0
        stop_s = round(time.monotonic() - t0, 1)
        wait("A again", lambda: (h := holder(k, name)).startswith("op-a_") and h != first and h, timeout_s=30)
        handover_s = round(time.monotonic() - t0, 1)
        assert a2.active() == 1 or wait("A active", lambda: a2.active() == 1, timeout_s=30)
        # the last one stops: no Lease left behind
        assert a2.proc is not None
        a2.proc.terminate()
        assert a2.proc.wait(30) == 0
        assert holder(k, name) == "" and k.run("get", "lease", LEASE, "-n", name, check=False).returncode != 0
        figures = {"takeover_after_sigkill_s": takeover_s, "sigterm_stop_s": stop_s, "handover_on_sigterm_s": handover_s}
        print("LEADER-E2E " + json.dumps(figures))
        assert takeover_s < 20, figures
    finally:
        for p in procs:
            p.kill()
