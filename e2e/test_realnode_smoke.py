"""Smoke test of the real node: real pods under a real kubelet, containerd and runc.

One namespace per run holds: a headless Service ``peer`` with one pod ``peer-0``; a ``smoke`` pod that runs
busybox and the project's venv Python (hostPath mounts from ``realnode.venv_python_parts``), resolves the
peer by DNS, and calls the apiserver through the ``kubernetes`` Service with its service-account token;
a ``crasher`` pod whose container exits with a chosen code and is restarted by the kubelet.

Needs a cluster with the real node: ``make cluster-up REAL_NODE=1`` (then this module uses it), or
``KUBEFORGE_REAL_NODE=1`` (then this module starts one and stops it afterwards). Without either it skips,
saying so; with ``KUBEFORGE_REAL_NODE=1`` a node that is not Ready is a failure, not a skip.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kfcluster import kube, lifecycle
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]


# Runs inside the smoke pod with the host's Python; prints one JSON line the test parses.
SMOKE_SCRIPT = r"""
import json, os, socket, ssl, sys, time, urllib.request
out = {"python": sys.version.split()[0], "executable": sys.executable}
peer = os.environ["PEER"]
deadline = time.monotonic() + 45
while True:
    try:
        out["peer_ip"] = socket.gethostbyname(peer)
        break
    except OSError as exc:  # CoreDNS learns a new pod within seconds; clients retry
        if time.monotonic() > deadline:
            out["peer_error"] = repr(exc)
            break
        time.sleep(0.5)
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
token = open(f"{sa}/token").read()
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
req = urllib.request.Request(f"https://{host}:{port}/apis/authentication.k8s.io/v1/selfsubjectreviews",
                             data=body, method="POST",
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
with urllib.request.urlopen(req, context=ctx, timeout=20) as resp:
    out["api_user"] = json.load(resp)["status"]["userInfo"]["username"]
out["service_host"] = host
import yaml  # from the venv: proves the venv's site-packages are visible
out["yaml"] = yaml.__version__
print("SMOKE " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def k(cluster: lifecycle.Cluster) -> kube.Kubectl:
    return cluster.kubectl


@pytest.fixture(scope="module")
def namespace(k: kube.Kubectl) -> Iterator[str]:
    name = f"kf-smoke-{uuid.uuid4().hex[:6]}"
    k.run("create", "namespace", name)
    yield name
    k.run("delete", "namespace", name, "--wait=true", "--timeout=60s", check=False, timeout_s=90)


def pod(name: str, *, command: list[str], restart: str = "Never", labels: dict[str, str] | None = None,
        extra_spec: dict[str, Any] | None = None, python: bool = False) -> dict[str, Any]:
    """A pod on the real node running ``command`` in the base image (with the venv Python if asked)."""
    container: dict[str, Any] = {"name": "main", "image": realnode.BASE_IMAGE, "imagePullPolicy": "Never",
                                 "command": command}
    spec: dict[str, Any] = {"restartPolicy": restart, "terminationGracePeriodSeconds": 1,
                            "containers": [container], **(extra_spec or {})}
    if python:
        parts = realnode.venv_python_parts()
        container["volumeMounts"] = parts.volume_mounts
        container["env"] = parts.env + container.get("env", [])
        spec["volumes"] = parts.volumes
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": realnode.on_real_node(spec)}


def get_pod(k: kube.Kubectl, ns: str, name: str) -> dict[str, Any]:
    return k.get_json("pod", name, "-n", ns)  # type: ignore[no-any-return]


def test_pod_runs_python_resolves_peer_and_calls_api(k: kube.Kubectl, namespace: str) -> None:
    peer_svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "peer"},
                "spec": {"clusterIP": "None", "selector": {"app": "peer"}, "ports": [{"name": "p", "port": 5555}]}}
    k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(peer_svc))
    peer = pod("peer-0", command=["sleep", "3600"], labels={"app": "peer"},
               extra_spec={"hostname": "peer-0", "subdomain": "peer"})
    k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(peer))
    k.run("wait", "-n", namespace, "--for=condition=Ready", "pod/peer-0", "--timeout=90s", timeout_s=100)
    peer_ip = get_pod(k, namespace, "peer-0")["status"]["podIP"]

    smoke = pod("smoke", python=True, command=[
        "sh", "-c", 'echo hello from busybox; busybox | head -n 1; exec python -c "$SCRIPT"'])
    smoke["spec"]["containers"][0]["env"] += [
        {"name": "SCRIPT", "value": SMOKE_SCRIPT},
        {"name": "PEER", "value": f"peer-0.peer.{namespace}.svc.cluster.local"},
    ]
    k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(smoke))
    phase = kube.wait_for("smoke pod finished", lambda: _finished(k, namespace, "smoke"), timeout_s=120)
    logs = k.run("logs", "-n", namespace, "smoke").stdout
    assert phase == "Succeeded", f"smoke pod {phase}; logs:\n{logs}"
    assert "hello from busybox" in logs
    result = json.loads(next(line for line in logs.splitlines() if line.startswith("SMOKE "))[len("SMOKE "):])
    assert result["executable"] == realnode.venv_python_parts().python
    assert result.get("peer_ip") == peer_ip, result
    assert result["api_user"] == f"system:serviceaccount:{namespace}:default"
    assert result["service_host"] == k.get_json("service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
    got = get_pod(k, namespace, "smoke")
    assert got["spec"]["nodeName"] == realnode.NODE_NAME
    assert got["status"]["podIP"].startswith("10.88.")


def _finished(k: kube.Kubectl, ns: str, name: str) -> str | None:
    phase = get_pod(k, ns, name)["status"].get("phase")
    return phase if phase in ("Succeeded", "Failed") else None


def test_killed_container_is_restarted_with_its_exit_code(k: kube.Kubectl, namespace: str) -> None:
    code = random.randint(3, 120)
    crasher = pod("crasher", restart="Always", command=["sh", "-c", f"echo attempt; sleep 1; exit {code}"])
    k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(crasher))

    def restarted() -> dict[str, Any] | None:
        st = (get_pod(k, namespace, "crasher")["status"].get("containerStatuses") or [{}])[0]
        return st if st.get("restartCount", 0) >= 1 and st.get("lastState", {}).get("terminated") else None

    status = kube.wait_for("crasher restarted once", restarted, timeout_s=90)
    assert status["lastState"]["terminated"]["exitCode"] == code
    assert status["lastState"]["terminated"]["reason"] == "Error"
    assert "attempt" in k.run("logs", "-n", namespace, "crasher", "--previous").stdout


def test_real_node_is_tainted_against_stray_pods(k: kube.Kubectl) -> None:
    """Pods meant for kwok GPU nodes (no toleration) must never land on the real node and fail on its images."""
    nodes = k.get_json("nodes", "-l", f"{realnode.NODE_LABEL}=true")["items"]
    assert nodes, "no real node"
    for node in nodes:
        taints = node["spec"].get("taints", [])
        assert any(t["key"] == realnode.NODE_LABEL and t["effect"] == "NoSchedule" for t in taints), taints
