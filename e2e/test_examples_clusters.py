"""Every manifest in ``examples/`` on both test-cluster variants, with the operator running.

The variants (``scheduler_variant``): the session's cluster, whose kube-scheduler runs Coscheduling with the
PodGroup CRD installed, and the stock-kube-scheduler cluster (``make cluster-up SCHEDULER=default``: no gang
scheduler, no PodGroup CRD), the cluster a user brings who runs none.

What a kwok cluster can show, and all this test claims for each example:
- the API server admits it through the operator's admission webhook (registered by the operator; ``kubectl
  apply`` fails when the webhook refuses);
- the gang object is the one its backend calls for on that cluster: a PodGroup named like the job, and its pods
  labelled for it, exactly where Coscheduling is the backend (explicit, or chosen by ``Auto``: its condition
  ``GangScheduling`` names the choice), none elsewhere; the operator names ``default-scheduler`` as the PodGroups'
  scheduler on both variants, as an admin would, so on the stock variant ``Auto`` sees no PodGroup API and chooses
  None;
- every role pod is bound to a kwok node and Running and Ready, and the job's phase is Running with every pod ready.
kwok pods run no code: no container starts, nothing trains or reads a volume. Training is shown by the runtime
suites (``kubeforge run``) and in real pods by the realnode suites.

Changes the test makes to a manifest: every role tolerates the kwok nodes' taint (``testing.KWOK_TOLERATION``);
examples whose pods mount claims get them from ``examples/storage/own-model-storage.yaml`` (the claims only;
``own-model-gpu-checkpoints`` under its own name, as docs/guide.md says), bound to PersistentVolumes the test
creates (a kwok cluster has no storage provisioner). ``examples/storage/own-model-storage.yaml`` itself runs as a
case too: its claims Bound, its upload pod Running.

An example that cannot run on a variant says why in one comment line, ``# not on <variant>: <why>`` (``variant``:
``coscheduling`` or ``default``); the test skips that pair with that reason and fails on a malformed line.
"""
from __future__ import annotations

import copy
import json
import pathlib
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kfcluster import config as kfconfig
from kfcluster import harness, lifecycle, testing
from kfcluster.harness import wait

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
ROOT = harness.ROOT
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
STORAGE = ROOT / "examples" / "storage" / "own-model-storage.yaml"
ROLES = ("generator", "verifier", "trainer")
LABEL_JOB = "kubeforge.dev/job"
NOT_ON = re.compile(r"^#\s*not on (\S+):\s*(\S.*)$")
WAIT_S = 240.0
COSCHEDULING = ("--coscheduling-scheduler-name=default-scheduler",)


def not_on(path: pathlib.Path) -> dict[str, str]:
    """variant -> reason, from the example's ``# not on <variant>: <why>`` lines."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = NOT_ON.match(line.strip())
        if m:
            assert m.group(1) in kfconfig.SCHEDULERS, f"{path.name}: unknown variant in {line!r}"
            out[m.group(1)] = m.group(2)
    return out


def rljob(path: pathlib.Path, ns: str) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = ns
    roles = doc["spec"].setdefault("roles", {})
    for role in ROLES:
        roles.setdefault(role, {}).setdefault("tolerations", []).append(dict(testing.KWOK_TOLERATION))
    return doc


def claims_of(doc: dict[str, Any]) -> set[str]:
    spec = doc["spec"]
    names = {v["persistentVolumeClaim"]["claimName"] for r in spec.get("roles", {}).values()
             for v in r.get("volumes", []) if "persistentVolumeClaim" in v}
    if spec.get("checkpoint", {}).get("claimName"):
        names.add(spec["checkpoint"]["claimName"])
    return names


def storage_docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(STORAGE.read_text()) if d]


def provide_claims(k: harness.K, ns: str, names: set[str]) -> None:
    """The storage example's claims that ``names`` asks for (a checkpoint claim of another name is the storage
    example's checkpoint claim renamed), each with a PersistentVolume of its size to bind to."""
    pvcs = {d["metadata"]["name"]: d for d in storage_docs() if d["kind"] == "PersistentVolumeClaim"}
    for name in sorted(names):
        pvc = copy.deepcopy(pvcs.get(name) or pvcs["own-model-checkpoints"])
        pvc["metadata"] = {"name": name, "namespace": ns}
        k.apply(pvc)
        k.apply(volume_for(pvc, ns))


def volume_for(pvc: dict[str, Any], ns: str) -> dict[str, Any]:
    """A PersistentVolume pre-bound to ``pvc`` (claimRef), so no other claim takes it."""
    name = f"{ns}-{pvc['metadata']['name']}"[:63]
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
            "spec": {"capacity": {"storage": pvc["spec"]["resources"]["requests"]["storage"]},
                     "accessModes": pvc["spec"]["accessModes"], "persistentVolumeReclaimPolicy": "Delete",
                     "hostPath": {"path": f"/tmp/kf-examples/{name}"},
                     "claimRef": {"namespace": ns, "name": pvc["metadata"]["name"]}}}


def expected_backend(doc: dict[str, Any], cluster: lifecycle.Cluster) -> tuple[str, str]:
    """(the backend the operator should use, the ``GangScheduling`` reason ``Auto`` writes, "" for an explicit
    backend): the manifest's backend, or ``Auto``'s choice on this cluster (docs/operator.md, "gang.backend: Auto":
    Kueue with a queue label; Coscheduling where PodGroups are served and the operator names their scheduler, which
    it does on both variants here; else None)."""
    backend = doc["spec"].get("gang", {}).get("backend", "Auto")
    if backend != "Auto":
        return str(backend), ""
    if doc["metadata"].get("labels", {}).get("kueue.x-k8s.io/queue-name"):
        return "Kueue", "AutoChoseKueue"
    if cluster.scheduler == kfconfig.SCHEDULER_COSCHEDULING:
        return "Coscheduling", "AutoChoseCoscheduling"
    return "None", "AutoChoseNone"


def wait_running_whole(k: harness.K, ns: str, name: str) -> dict[str, Any]:
    """The job's status once it is Running with every pod ready; on timeout the error shows the last status and
    the job's pods (phase, node), which say where it stopped."""
    seen: dict[str, Any] = {}

    def probe() -> Any:
        seen["status"] = st = k.get("rljob", name, "-n", ns).get("status", {})
        roles = st.get("roles") or {}
        whole = roles and all(r.get("ready") == r.get("replicas") and r.get("replicas", 0) > 0 for r in roles.values())
        return st if st.get("phase") == "Running" and whole else None
    try:
        return dict(wait(f"{name} Running with every pod ready", probe, timeout_s=WAIT_S))
    except TimeoutError as exc:
        pods = [(p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("nodeName"))
                for p in k.items("pods", ns, f"{LABEL_JOB}={name}")]
        raise TimeoutError(f"{exc}\nstatus: {json.dumps(seen.get('status'))}\npods: {pods}") from None


@pytest.fixture(scope="module")
def env(scheduler_variant: lifecycle.Cluster,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[lifecycle.Cluster, harness.K]]:
    cluster = scheduler_variant
    k = harness.K(kubectl=cluster.kubectl.binary, kubeconfig=cluster.kubeconfig)
    k.ensure_crd()
    # configured as an admin of either cluster might: it names the scheduler that would serve PodGroups
    op = harness.Operator(kubeconfig=cluster.kubeconfig, extra=("--all-namespaces", *COSCHEDULING),
                          log_path=tmp_path_factory.mktemp("operator") / "operator.log").start()
    # kopf registers the webhook once its server listens: the examples must go through it
    wait("the webhook configuration", lambda: k.run("get", "validatingwebhookconfiguration/kubeforge.dev",
                                                    check=False).returncode == 0, timeout_s=90)
    yield cluster, k
    op.stop()


@pytest.fixture
def ns(env: tuple[lifecycle.Cluster, harness.K]) -> Iterator[str]:
    _, k = env
    name = k.namespace(f"ex-{uuid.uuid4().hex[:8]}")
    yield name
    k.run("delete", "rljobs", "--all", "-n", name, "--wait=false", check=False)
    k.run("delete", "namespace", name, "--wait=false", check=False)
    for pv in k.get("pv")["items"]:
        if pv["metadata"]["name"].startswith(f"{name}-"):
            k.run("delete", "pv", pv["metadata"]["name"], "--wait=false", check=False)


def test_every_example_declares_its_variants() -> None:
    """The skip lines parse and name a known variant (a typo would otherwise skip nothing, silently)."""
    for path in EXAMPLES:
        not_on(path)
    assert len(EXAMPLES) >= 10, "examples/ lost its manifests?"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_on_the_cluster(env: tuple[lifecycle.Cluster, harness.K], ns: str, path: pathlib.Path) -> None:
    cluster, k = env
    why = not_on(path).get(cluster.scheduler)
    if why:
        pytest.skip(f"{path.name} not on {cluster.scheduler}: {why}")
    doc = rljob(path, ns)
    name = doc["metadata"]["name"]
    provide_claims(k, ns, claims_of(doc))
    applied = k.run("apply", "-f", "-", stdin=json.dumps(doc), check=False)
    assert applied.returncode == 0, f"{path.name} refused on {cluster.scheduler}: {applied.stderr.strip()}"
    st = wait_running_whole(k, ns, name)
    every = k.items("pods", ns, f"{LABEL_JOB}={name}")
    # the user's agent pods (spec.agent) carry the job's label but are outside the gang (docs/agents.md)
    pods = [p for p in every if p["metadata"]["labels"].get("kubeforge.dev/role") != "agent"]
    assert len(pods) == sum(r["replicas"] for r in st["roles"].values())
    agent = doc["spec"].get("agent")
    assert len(every) - len(pods) == (agent.get("replicas", 1) if agent else 0), "the agent pods"
    for p in pods:
        assert p["spec"].get("nodeName", "").startswith("kwok-"), f"{p['metadata']['name']} not on a kwok node"
        assert p["status"]["phase"] == "Running"
    backend, auto_reason = expected_backend(doc, cluster)
    if auto_reason:
        chosen = next(c for c in st["conditions"] if c["type"] == "GangScheduling")
        assert chosen["reason"] == auto_reason, chosen
    group_labels = {p["metadata"].get("labels", {}).get(testing.PODGROUP_LABEL) for p in pods}
    if backend == "Coscheduling":
        assert k.get("podgroups.scheduling.x-k8s.io", name, "-n", ns)["spec"]["minMember"] >= 1
        assert group_labels == {name}
    else:
        assert group_labels == {None}, f"{backend}: pods labelled for a PodGroup"
        if cluster.scheduler == kfconfig.SCHEDULER_COSCHEDULING:
            assert k.items("podgroups.scheduling.x-k8s.io", ns) == []


def test_storage_example_binds_and_runs_its_upload_pod(env: tuple[lifecycle.Cluster, harness.K], ns: str) -> None:
    _, k = env
    for doc in storage_docs():
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = ns
        if doc["kind"] == "Pod":
            doc["spec"].setdefault("tolerations", []).append(dict(testing.KWOK_TOLERATION))
        else:
            k.apply(volume_for(doc, ns))
        k.apply(doc)
    names = [d["metadata"]["name"] for d in storage_docs() if d["kind"] == "PersistentVolumeClaim"]
    wait("claims Bound", lambda: all(k.get("pvc", n, "-n", ns)["status"].get("phase") == "Bound" for n in names),
         timeout_s=WAIT_S)
    wait("upload pod Running", lambda: k.get("pod", "kubeforge-upload", "-n", ns)["status"].get("phase") == "Running",
         timeout_s=WAIT_S)
