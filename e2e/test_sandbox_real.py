"""A sandbox claim in real pods (``spec.sandbox``; docs/sandboxes.md): the operator's renderers' sandbox pods on the
real node, claimed, run on, released, and a hang killed.

What runs: the Secret, headless Service and StatefulSet that ``render.sandbox`` makes for a job with
``spec.sandbox`` (owner references dropped: no RLJob object, so the garbage collector must not take them), with
the real node's parts (busybox base image, the host's venv Python mounted read-only, the harness's wrapper as PID 1:
``realjob.role_template``), which ``spec.sandbox`` accepts (plain env values, hostPath volumes). The pods run as the
renderer says: UID 1000, read-only root, all capabilities dropped, seccomp RuntimeDefault, no ServiceAccount token.
The test, on the host, reaches each pod's IP (the node's pod network) with ``sandboxes.client``: a claim, a run that
passes, a run that fails its tests, a release; a hang (``while True``) past its limit answered ``timeout`` and its
lease reset (never handed back); the pod's own counters (``/metrics``) and its processes (``kubectl exec ps``: only
the wrapper and the server are left). The NetworkPolicy is not applied here (it would keep the host out;
``tests/operator/test_render_security.py`` checks what it admits).

Needs the real node (``KUBEFORGE_REAL_NODE=1``, under ``flock /tmp/kubeforge-realnode.lock``); skips otherwise.
"""
from __future__ import annotations

import json
import secrets
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import realjob
from kfcluster import kube, lifecycle
from kubeforge.api import contract, load
from kubeforge.operator.render import context, sandbox as sandbox_render
from kubeforge.runtime.sandboxes import client
from kubeforge.runtime.verifiers import sandbox
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

GOOD = "def f(x):\n    return 2 * x\n"
TESTS = ["assert f(2) == 4", "assert f(3) == 6"]


@pytest.fixture(scope="module")
def k(cluster: lifecycle.Cluster) -> kube.Kubectl:
    return cluster.kubectl


@pytest.fixture(scope="module")
def namespace(k: kube.Kubectl) -> Iterator[str]:
    name = f"kf-sandbox-{uuid.uuid4().hex[:6]}"
    k.run("create", "namespace", name)
    yield name
    k.run("delete", "namespace", name, "--wait=true", "--timeout=90s", check=False, timeout_s=120)


def sandbox_job(namespace: str) -> Any:
    parts = realnode.venv_python_parts()
    pods = realjob.role_template({"replicas": 1, "slots": 4, "maxRunSeconds": 20}, parts=parts, extra_env={},
                                 volumes=[], mounts=[])
    doc = {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "sbx", "namespace": namespace},
           "spec": {"model": {"builtin": "tiny"}, "task": {"code": {}, "seed": 0},
                    "algorithm": {"maxNewTokens": 64},
                    "verifiers": [{"name": "tests", "type": "CodeExecution"}], "sandbox": pods}}
    return load.parse(doc)        # the real node's parts pass spec.sandbox's validation


def objects(job: Any, namespace: str, key_hex: str) -> list[dict[str, Any]]:
    ctx = context.RenderContext(namespace=namespace, uid="00000000-0000-0000-0000-00000000000s", attempt=0,
                                image=realnode.BASE_IMAGE)
    out = [sandbox_render.key_secret(job, ctx, key_hex=key_hex), sandbox_render.headless_service(job, ctx),
           sandbox_render.statefulset(job, ctx)]
    for o in out:
        o["metadata"].pop("ownerReferences", None)
    out[2]["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    out[2]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 5
    return out


def metric(ip: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://{ip}:{contract.DEFAULT_PORT_BASE + contract.PORT_METRICS}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(name + "{") and want in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_sandbox_claim_in_real_pods(k: kube.Kubectl, namespace: str) -> None:
    job = sandbox_job(namespace)
    key_hex = secrets.token_hex(32)
    for obj in objects(job, namespace, key_hex):
        k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(obj))
    k.run("wait", "-n", namespace, "--for=condition=Ready", "pod/sbx-sandbox-0", "--timeout=300s", timeout_s=320)
    pod = k.get_json("pod", "sbx-sandbox-0", "-n", namespace)
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not any(v.get("projected") or v.get("secret") for v in pod["spec"]["volumes"])
    ip = pod["status"]["podIP"]
    pool = client.Pool([f"http://{ip}:{contract.DEFAULT_PORT_BASE + contract.PORT_SANDBOX}"],
                       key=bytes.fromhex(key_hex), claim_seconds=60.0)

    t0 = time.monotonic()
    lease = pool.claim()
    claim_s = time.monotonic() - t0
    ok = lease.run(GOOD, TESTS, sandbox.Limits(timeout_s=10.0))
    assert (ok.status, ok.passed, ok.total) == ("ok", 2, 2), ok
    wrong = lease.run("def f(x):\n    return x\n", TESTS, sandbox.Limits(timeout_s=10.0))
    assert (wrong.status, wrong.passed) == ("ok", 0) and lease.open
    lease.release()

    hung = pool.claim()
    t0 = time.monotonic()
    r = hung.run("while True:\n    pass\n", TESTS, sandbox.Limits(timeout_s=2.0))
    hang_s = time.monotonic() - t0
    assert r.status == "timeout" and r.passed == 0 and not hung.open, r
    assert hang_s < 2.0 + sandbox.STARTUP_S + 15
    again = pool.claim()
    assert again.lease_id != hung.lease_id and again.run(GOOD, TESTS, sandbox.Limits()).passed == 2
    again.release()

    assert metric(ip, "kubeforge_sandbox_runs_total", status="ok") == 3
    assert metric(ip, "kubeforge_sandbox_runs_total", status="timeout") == 1
    assert metric(ip, "kubeforge_sandbox_resets_total", reason="dirty") == 1
    assert metric(ip, "kubeforge_sandbox_resets_total", reason="release") == 2
    assert metric(ip, "kubeforge_sandbox_leases") == 0
    ps = k.run("exec", "-n", namespace, "sbx-sandbox-0", "--", "ps", "-o", "pid,args").stdout
    running = [ln for ln in ps.splitlines()[1:] if ln.strip() and " ps " not in f" {ln} "]
    assert len(running) <= 2, ps               # the wrapper and the server: the hang and its lease are gone
    logs = k.run("logs", "-n", namespace, "sbx-sandbox-0").stdout
    print(json.dumps({"claim_s": round(claim_s, 4), "hang_killed_s": round(hang_s, 2),
                      "mechanisms": [ln for ln in logs.splitlines() if "mechanisms" in ln]}))
