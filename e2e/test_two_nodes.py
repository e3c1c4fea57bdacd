"""Two real nodes (issue 31 item 1): kf-real-0 in the root network namespace, kf-real-1 in its own, one cluster.

Checks, with one busybox HTTP server pod pinned to each node and a ClusterIP Service in front of each:
both nodes Ready with their own node IPs and pod ranges; the pod on node 0 reaches the pod on node 1 by Service
DNS name (CoreDNS on node 0, kube-proxy on node 0 DNATs to a pod behind the veth into kf-real-1), and back (node 1's
pod resolves through node 0's CoreDNS, its own kube-proxy DNATs); ``kubectl exec`` works on both kubelets.

Cluster: the session's (or ``make cluster-up REAL_NODES=2``'s) when it has two real nodes Ready; when it has only
kf-real-0, this module adds kf-real-1 to it (``e2e/node/extra-node.sh``, ~5 s) and removes it at the end; with
no cluster and ``KUBEFORGE_REAL_NODE=1`` it starts one. Skips, printing why, when the machine cannot host a second
node (``realnode.cannot_host_nodes``) or ``KF_SKIP_TWO_NODES=1``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import twonodes
from kfcluster import kube, lifecycle
from node import realnode

pytestmark = [pytest.mark.realnode, pytest.mark.cluster]

EXTRA_NODE = realnode.SCRIPTS_DIR / "extra-node.sh"
PORT = 8080


def record(**fields: Any) -> None:
    """Merge figures into the JSON file named by ``KF_E2E_NODES_OUT`` (``make e2e-nodes`` prints it last)."""
    out = os.environ.get("KF_E2E_NODES_OUT")
    if not out:
        return
    path = pathlib.Path(out)
    doc = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**doc, **fields}))


@pytest.fixture(scope="module")
def cluster() -> Iterator[lifecycle.Cluster]:
    """A cluster with kf-real-0 and kf-real-1 Ready (reused, extended by node 1, or started here)."""
    with twonodes.cluster() as running:
        yield running


@pytest.fixture(scope="module")
def k(cluster: lifecycle.Cluster) -> kube.Kubectl:
    return cluster.kubectl


@pytest.fixture(scope="module")
def namespace(k: kube.Kubectl) -> Iterator[str]:
    name = f"kf-2n-{uuid.uuid4().hex[:6]}"
    k.run("create", "namespace", name)
    yield name
    k.run("delete", "namespace", name, "--wait=true", "--timeout=60s", check=False, timeout_s=90)


def server(name: str, node: str) -> dict[str, Any]:
    """A busybox HTTP server on ``node`` whose page is the name of the node it runs on (downward API)."""
    script = f'mkdir -p /tmp/www && echo "$NODE_NAME" >/tmp/www/index.html && exec busybox httpd -f -p {PORT} -h /tmp/www'
    container = {"name": "main", "image": realnode.BASE_IMAGE, "imagePullPolicy": "Never",
                 "command": ["sh", "-c", script],
                 "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]}
    # The venv's Python too, as the client: busybox is static glibc, whose resolver crashes (segfault) on lookups.
    # (The running interpreter's venv and its checkout: only the standard library is used.)
    venv = pathlib.Path(sys.prefix)
    parts = realnode.venv_python_parts(venv=venv, repo=venv.parent)
    container["volumeMounts"] = parts.volume_mounts
    container["env"] += parts.env
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container],
            "volumes": parts.volumes}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
            "spec": realnode.on_real_node(spec, node=node)}


def service(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": PORT}]}}


FETCH = r"""
import sys, time, urllib.request
url, deadline, err = sys.argv[1], time.monotonic() + 30, None
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            print(resp.read().decode().strip())
            sys.exit(0)
    except OSError as exc:  # a new Service's name and rules take a few seconds to appear
        err = exc
        time.sleep(0.5)
sys.exit(f"unreachable: {url}: {err!r}")
"""


def fetch(k: kube.Kubectl, ns: str, pod: str, url: str) -> str:
    """GET ``url`` from inside ``pod`` with the venv's Python (retrying for up to 30 s)."""
    res = k.run("exec", "-n", ns, pod, "--", "python", "-c", FETCH, url, check=False, timeout_s=90)
    assert res.returncode == 0, f"{pod} -> {url}: rc {res.returncode}: {res.stderr}"
    return res.stdout.strip()


@pytest.fixture(scope="module")
def pods(k: kube.Kubectl, namespace: str) -> dict[str, dict[str, Any]]:
    names = {"web-0": realnode.node_name(0), "web-1": realnode.node_name(1)}
    for name, node in names.items():
        k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(server(name, node)))
        k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(service(name)))
    k.run("wait", "-n", namespace, "--for=condition=Ready", *[f"pod/{n}" for n in names], "--timeout=90s",
          timeout_s=100)
    return {n: k.get_json("pod", n, "-n", namespace) for n in names}


def test_both_real_nodes_ready_with_their_own_addresses(k: kube.Kubectl) -> None:
    nodes = {n["metadata"]["name"]: n for n in k.get_json("nodes", "-l", f"{realnode.NODE_LABEL}=true")["items"]}
    for i in (0, 1):
        name = realnode.node_name(i)
        assert name in nodes, sorted(nodes)
        assert realnode.node_status_from_named(nodes[name]).up, realnode.node_status_from_named(nodes[name]).reason
        ips = [a["address"] for a in nodes[name]["status"]["addresses"] if a["type"] == "InternalIP"]
        assert ips == [f"{realnode.node_pod_prefix(i)}0.1"], ips


def test_pods_run_on_their_nodes_with_their_nodes_pod_ranges(pods: dict[str, dict[str, Any]]) -> None:
    for i in (0, 1):
        pod = pods[f"web-{i}"]
        assert pod["spec"]["nodeName"] == realnode.node_name(i)
        assert pod["status"]["podIP"].startswith(f"{realnode.node_pod_prefix(i)}"), pod["status"]["podIP"]


def test_pod_on_node_0_reaches_pod_on_node_1_by_service_name_and_back(
        k: kube.Kubectl, namespace: str, pods: dict[str, dict[str, Any]]) -> None:
    # Node 0 -> node 1: full Service DNS name; the page names the node that served it.
    assert fetch(k, namespace, "web-0", f"http://web-1.{namespace}.svc.cluster.local:{PORT}/") == realnode.node_name(1)
    # Node 1 -> node 0: short name through the pod's search path (node 1's resolv.conf names node 0's CoreDNS).
    assert fetch(k, namespace, "web-1", f"http://web-0:{PORT}/") == realnode.node_name(0)
    # Pod IP to pod IP across the node boundary (no Service in between).
    ip1 = pods["web-1"]["status"]["podIP"]
    assert fetch(k, namespace, "web-0", f"http://{ip1}:{PORT}/") == realnode.node_name(1)


# ------------------------------------------------------------------ NetworkPolicy enforced (issue 31 item 2)

NETPOL = realnode.SCRIPTS_DIR / "netpol.sh"
JOB = "tiny"

PROBE = r"""
import concurrent.futures, json, socket, sys
def reach(target):
    host, port = target.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except OSError:
        return False
targets = sys.argv[1:]
with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(reach, targets)))))
"""


def rendered_policy(namespace: str) -> dict[str, Any]:
    """The operator's own NetworkPolicy for the tiny RLJob in ``namespace`` (operator/render/network.py)."""
    from kubeforge.api import load
    from kubeforge.operator.render import context, network

    job = load.load_file(realnode.REPO_ROOT / "examples" / "tiny.yaml")
    job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": namespace})})
    policy = network.network_policy(job, context.RenderContext(namespace=namespace, uid="e2e"))
    policy["metadata"].pop("ownerReferences", None)     # no RLJob object here to own it
    return policy


def listener(name: str, node: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod on ``node`` listening on every role port (busybox httpd per port), with the venv's Python to probe."""
    from kubeforge.api import contract

    ports = [contract.DEFAULT_PORT_BASE + off for off in range(5)]
    script = "mkdir -p /tmp/www && echo ok >/tmp/www/index.html; " + " ".join(
        f"busybox httpd -p {p} -h /tmp/www;" for p in ports) + " exec sleep 3600"
    doc = server(name, node)
    doc["metadata"]["labels"] = labels
    doc["spec"]["containers"][0]["command"] = ["sh", "-c", script]
    return doc


def probe(k: kube.Kubectl, ns: str, pod: str, targets: list[str]) -> dict[str, bool]:
    res = k.run("exec", "-n", ns, pod, "--", "python", "-c", PROBE, *targets, check=False, timeout_s=60)
    assert res.returncode == 0, f"probe from {pod}: {res.stderr}"
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def enforcer(cluster: lifecycle.Cluster) -> Iterator[None]:
    """kube-router's NetworkPolicy controller on both nodes for this module's NetworkPolicy tests."""
    subprocess.run(["bash", str(NETPOL), cluster.workdir, "up"], check=True, timeout=240)
    try:
        yield
    finally:
        subprocess.run(["bash", str(NETPOL), cluster.workdir, "down"], check=False, timeout=120)


def test_job_network_policy_blocks_strangers_and_passes_the_jobs_own_pods(
        k: kube.Kubectl, namespace: str, enforcer: None) -> None:
    from kubeforge.api import contract

    job = {contract.LABEL_JOB: JOB}
    pods = {"job-a": (0, {**job, contract.LABEL_ROLE: "trainer"}), "job-b": (1, {**job, contract.LABEL_ROLE: "generator"}),
            "stranger-0": (0, {"app": "stranger"}), "stranger-1": (1, {"app": "stranger"})}
    for name, (node, labels) in pods.items():
        k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(listener(name, realnode.node_name(node), labels)))
    k.run("wait", "-n", namespace, "--for=condition=Ready", *[f"pod/{n}" for n in pods], "--timeout=90s", timeout_s=100)
    ip = {n: k.get_json("pod", n, "-n", namespace)["status"]["podIP"] for n in pods}
    metrics = contract.DEFAULT_PORT_BASE + contract.PORT_METRICS
    role_ports = [contract.DEFAULT_PORT_BASE + p for p in (contract.PORT_DATA, contract.PORT_CONTROL,
                                                           contract.PORT_DIST, contract.PORT_WEIGHTS)]
    role_targets = [f"{ip[t]}:{p}" for t in ("job-a", "job-b") for p in role_ports]
    # Control: without the policy a stranger reaches every role port (so a blocked port below is the policy's doing).
    before = probe(k, namespace, "stranger-0", role_targets)
    assert all(before.values()), before

    k.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(rendered_policy(namespace)))

    def blocked() -> dict[str, dict[str, bool]] | None:
        seen = {s: probe(k, namespace, s, role_targets) for s in ("stranger-0", "stranger-1")}
        return seen if not any(v for got in seen.values() for v in got.values()) else None

    record(strangerBlocked=False)
    kube.wait_for("strangers blocked from every role port on both nodes", blocked, timeout_s=60, interval_s=2.0)
    record(strangerBlocked=True)
    # Metrics stay open to anyone (scrapers, probes): the policy's second rule.
    open_metrics = probe(k, namespace, "stranger-1", [f"{ip['job-a']}:{metrics}", f"{ip['job-b']}:{metrics}"])
    assert all(open_metrics.values()), open_metrics
    # The job's own pods still reach each other on every port, across the node boundary both ways.
    a_to_b = probe(k, namespace, "job-a", [f"{ip['job-b']}:{p}" for p in [metrics, *role_ports]])
    b_to_a = probe(k, namespace, "job-b", [f"{ip['job-a']}:{p}" for p in [metrics, *role_ports]])
    assert all(a_to_b.values()) and all(b_to_a.values()), (a_to_b, b_to_a)


# ------------------------------------------------------------------ roles across nodes (issue 31 item 3)

JOB_STEPS = 12


def test_trainer_and_generator_on_different_nodes_train_to_succeeded(cluster: lifecycle.Cluster) -> None:
    """The tiny RLJob states only role affinities (trainer apartFrom generator, verifier colocateWith generator);
    it trains to Succeeded with rollouts and weight syncs crossing the node boundary, every step once."""
    import tempfile

    import run_nodes  # noqa: F401  (also points the pods at this checkout's sources in a worktree)
    import run_real

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kf-2n-job-"))
    workdir.chmod(0o755)                # the hostPath checkpoint dir below it is used by UID 1000
    manifest = workdir / "rljob.yaml"
    manifest.write_text(json.dumps(run_nodes.placement_manifest(same_node=False, steps=JOB_STEPS)))
    result = run_real.run(cluster=cluster, workdir=workdir / "run", kill_after_step=None, timeout_s=600,
                          base=manifest)
    placed = run_nodes.nodes_of(result.pods)
    figures = {"nodes": placed, "phase": result.status.get("phase"), **run_nodes.step_figures(result.trainer_logs)}
    print(f"\n[two-nodes] job across nodes: {json.dumps(figures)}", file=sys.stderr, flush=True)
    record(nodesUsed=len(set().union(*placed.values())) if placed else 0, acrossNodes=figures)
    assert result.succeeded, (result.status, result.failures)
    trainer, generator = set(placed.get("trainer", [])), set(placed.get("generator", []))
    assert trainer and generator and not trainer & generator, placed
    assert placed.get("verifier") == placed.get("generator"), placed
    steps = [d["step"] for t in result.trainer_logs for d in run_real.json_lines(t)
             if isinstance(d.get("step"), int) and "mean_reward" in d]
    assert steps == list(range(1, JOB_STEPS + 1)), steps
    assert figures["syncs"] and figures["sync_bytes"], figures      # weights crossed to the other node


# ------------------------------------------------------------------ node loss (issue 31 item 4; docs/node-loss.md)

# The fault fires on training progress (trainer 0's step, run_real.Run.progress_step), never on the phase: 14 steps
# once trained in 6 s between two polls of a phase that still read Starting (the generator's readiness probe had not
# run yet), so a fault that waited for Running never fired. 40 steps keep the fault mid-run on a fast machine too.
LOSS_STEPS = 40
LOSS_AFTER_STEP = 6            # examples/tiny.yaml checkpoints every 5 steps: the job resumes from the last one
LOSS_GRACE_S = 10              # the chart's nodeLossGraceSeconds (its minimum) for this test
LOST = 1                       # node 0 hosts CoreDNS and the apiserver's address: only node i >= 1 can be lost
RUN_TIMEOUT_S = 1200           # apply -> Succeeded, one restart: two vLLM starts (400 s each seen at load 19)


def lineage(trainer_logs: list[str]) -> list[int]:
    """The steps the final model was trained through: each trainer log's steps after the step it resumed from."""
    import run_real

    out: list[int] = []
    for text in trainer_logs:
        resumed, steps = run_real.step_sequence(text)
        if resumed is None and not steps:
            continue            # a trainer that trained nothing (it failed before resuming) changes nothing
        out = out[:resumed or 0] + steps
    return out


def test_a_lost_node_is_survived_from_the_checkpoint_and_rejoins(cluster: lifecycle.Cluster, k: kube.Kubectl) -> None:
    """Mid-run, kf-real-1 (holding a role of the job) loses its kubelet, kube-proxy, containerd and every process
    of its pods (SIGKILL). The operator fails the pods it lost (NodeLost, naming the node) and force-deletes them;
    they come back on kf-real-0 (the manifest's rule: RestartRole for a generator or verifier, the trainer keeps
    running; a lost trainer restarts the job from its checkpoint) and the job reaches Succeeded with every step in
    its lineage once. Then the node rejoins Ready."""
    import tempfile
    import time

    import run_nodes  # noqa: F401  (also points the pods at this checkout's sources in a worktree)
    import run_real

    lost_node = realnode.node_name(LOST)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="kf-2n-loss-"))
    workdir.chmod(0o755)
    manifest = workdir / "rljob.yaml"
    manifest.write_text(json.dumps(run_nodes.node_loss_manifest(LOSS_STEPS)))
    lost: dict[str, Any] = {}
    # The node reads NotReady a grace (plus up to a period) after its last heartbeat: 40 s + 5 s at Kubernetes'
    # defaults (make e2e-nodes), 3m20s in a cluster started with kwokctl's own (make test's session cluster).
    monitor = realnode.node_monitor(cluster.workdir)
    timeout_s = RUN_TIMEOUT_S + monitor["node-monitor-grace-period"] + monitor["node-monitor-period"]
    print(f"\n[two-nodes] node lifecycle controller: {monitor}; run bound {timeout_s:.0f}s", file=sys.stderr,
          flush=True)

    def lose(step: int, pods: list[dict[str, Any]]) -> dict[str, Any]:
        on = sorted(p["metadata"]["labels"].get(run_real.LABEL_ROLE, "?") for p in pods
                    if p.get("spec", {}).get("nodeName") == lost_node and not p["metadata"].get("deletionTimestamp"))
        subprocess.run(["bash", str(EXTRA_NODE), cluster.workdir, str(LOST), "lose"], check=True, timeout=60)
        lost.update(node=lost_node, roles=on, at_step=step)
        print(f"\n[two-nodes] lost {lost_node} at step {step} (roles there: {on})", file=sys.stderr, flush=True)
        return dict(lost)

    rejoin_s = None
    try:
        result = run_real.run(cluster=cluster, workdir=workdir / "run", kill_after_step=LOSS_AFTER_STEP,
                              timeout_s=timeout_s, base=manifest, fault=lose,
                              chart_values=(f"nodeLossGraceSeconds={LOSS_GRACE_S}",))
    finally:
        if lost:
            t = time.monotonic()
            subprocess.run(["bash", str(EXTRA_NODE), cluster.workdir, str(LOST), "up"], check=True, timeout=180)
            kube.wait_for(f"{lost_node} Ready again", lambda: lost_node in realnode.ready_real_nodes(k) or None,
                          timeout_s=120, interval_s=2.0)
            rejoin_s = round(time.monotonic() - t, 1)
    line = lineage(result.trainer_logs)
    want = list(range(1, LOSS_STEPS + 1))
    failure = (result.failure_status or {}).get("lastFailure") or {}
    figures = {"lost": lost, "phase": result.status.get("phase"), "lastFailure": failure, "nodeMonitor": monitor,
               "nodeLossDetectSeconds": run_real._r(result.failure_seen_s),
               "nodeLossRecoverySeconds": run_real._r(result.next_step_s), "rejoinSeconds": rejoin_s,
               "lostSteps": sorted(set(want) - set(line)),
               "repeatedSteps": sorted({s for s in line if line.count(s) > 1}),
               # the operator's own account of the recovery, in parts (docs/recovery.md)
               "recoveryBreakdown": result.status.get("recoveryBreakdown")}
    print(f"\n[two-nodes] node loss: {json.dumps(figures)}", file=sys.stderr, flush=True)
    record(phase=figures["phase"], steps=(result.status.get("progress") or {}).get("step"),
           **{k: figures[k] for k in ("lostSteps", "repeatedSteps", "nodeLossDetectSeconds",
                                      "nodeLossRecoverySeconds", "rejoinSeconds", "recoveryBreakdown")},
           nodeLoss=figures)
    assert lost.get("roles"), f"no role of the job ran on {lost_node}: nothing was lost ({lost})"
    assert lost["at_step"] < LOSS_STEPS, f"the fault landed after the last step: {lost}"
    assert failure.get("reason") == "NodeLost" and failure.get("node") == lost_node, failure
    assert result.succeeded, (result.status, result.failures)
    assert line == want, line
    if "trainer" in lost["roles"]:      # no rule matches a trainer: RestartAll, from the checkpoint
        assert (result.status.get("attempt") or 0) >= 1, result.status
        assert len(result.trainer_logs) >= 2, "the trainer started again from its checkpoint"
    else:                               # RestartRole: the lost roles came back alone
        assert (result.status.get("restarts") or 0) >= 1, result.status
        assert len(result.trainer_logs) == 1, "the trainer on the node that worked kept running"
    breakdown = figures["recoveryBreakdown"] or {}
    assert breakdown.get("seconds") is not None and breakdown.get("detect") is not None, breakdown
    if {"trainer", "generator"} & set(lost["roles"]):
        assert result.next_step_s is not None, "no step trained after the loss"
