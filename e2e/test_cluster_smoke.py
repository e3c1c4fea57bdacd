"""Smoke tests of the test cluster itself: real kube-apiserver, controller-manager, Coscheduling scheduler,
kwok GPU nodes and the failure stages. Each test gets its own namespace; the gang test brings its own
nodes (a private ``pool`` label) so capacity used by other tests cannot change its outcome.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
import uuid

import pytest

from kfcluster import config as cfg
from kfcluster import lifecycle, procs, testing

pytestmark = pytest.mark.cluster


def _apps(api_client):  # type: ignore[no-untyped-def]
    from kubernetes import client

    return client.AppsV1Api(api_client)


def _core(api_client):  # type: ignore[no-untyped-def]
    from kubernetes import client

    return client.CoreV1Api(api_client)


def test_version_is_pinned(api_client) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    info = client.VersionApi(api_client).get_code()
    assert info.git_version == "v1.34.10"
    assert (info.major, info.minor) == ("1", "34")


def test_default_nodes_have_gpus_and_topology(kube_cluster, api_client) -> None:  # type: ignore[no-untyped-def]
    nodes = _core(api_client).list_node(label_selector=f"{cfg.KWOK_NODE_LABEL}={cfg.KWOK_NODE_LABEL_VALUE}").items
    default = [n for n in nodes if n.metadata.name.startswith("kwok-gpu-")]
    assert len(default) >= 4
    zones = {n.metadata.labels[cfg.ZONE_LABEL] for n in default}
    assert zones >= {"zone-a", "zone-b"}
    for n in default:
        assert n.status.allocatable[cfg.GPU_RESOURCE] == "8"
        assert n.metadata.annotations[cfg.FAKE_NODE_ANNOTATION] == cfg.FAKE_NODE_ANNOTATION_VALUE
        assert any(t.key == "kwok.x-k8s.io/node" and t.effect == "NoSchedule" for t in n.spec.taints)
        assert {c.type: c.status for c in n.status.conditions}["Ready"] == "True"


def test_statefulset_of_four_runs_on_kwok_nodes(namespace, api_client) -> None:  # type: ignore[no-untyped-def]
    sts = testing.statefulset(name="web", replicas=4, spec=testing.pod_spec(gpus=1))
    _apps(api_client).create_namespaced_stateful_set(namespace, sts)
    pods = testing.wait_for_pods(api_client, namespace=namespace, selector="app=web", count=4,
                                 ok=testing.is_running_ready, what="4 StatefulSet pods Running and Ready")
    nodes = {n.metadata.name: n for n in _core(api_client).list_node().items}
    for p in pods:
        assert nodes[p.spec.node_name].metadata.annotations.get(cfg.FAKE_NODE_ANNOTATION) == "fake"
    assert sorted(p.metadata.name for p in pods) == [f"web-{i}" for i in range(4)]


@pytest.fixture()
def gang_pool(kube_cluster, api_client):  # type: ignore[no-untyped-def]
    """Four private 1-GPU nodes (label kubeforge.dev/pool=<id>); a fifth is added by the test."""
    pool_id = f"gang-{uuid.uuid4().hex[:6]}"
    pool = cfg.NodePool(count=4, gpus=1, prefix=pool_id, zones=("zone-a",), extra_labels={"kubeforge.dev/pool": pool_id})
    cluster = lifecycle.add_nodes(kube_cluster, [pool])
    yield cluster, pool
    core = _core(api_client)
    for node in core.list_node(label_selector=f"kubeforge.dev/pool={pool_id}").items:
        core.delete_node(node.metadata.name)


def test_gang_holds_all_pods_until_capacity_for_all(namespace, api_client, gang_pool) -> None:  # type: ignore[no-untyped-def]
    from kubernetes import client

    cluster, pool = gang_pool
    pool_id = pool.extra_labels["kubeforge.dev/pool"]
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", namespace, "podgroups", testing.podgroup(name="gang", min_member=5))
    spec = testing.pod_spec(gpus=1, node_selector={"kubeforge.dev/pool": pool_id})
    sts = testing.statefulset(name="gang", replicas=5, spec=spec, labels={testing.PODGROUP_LABEL: "gang"})
    _apps(api_client).create_namespaced_stateful_set(namespace, sts)
    # Only 4 of the 5 fit. Watch long enough for several scheduling attempts, including the periodic
    # retry of unschedulable pods (10 s): no pod may be bound in the meantime.
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:
        pods = testing.list_pods(api_client, namespace=namespace, selector="app=gang")
        assert all(p.spec.node_name is None and p.status.phase == "Pending" for p in pods), testing.summary(pods)
        time.sleep(1)
    assert len(pods) == 5, testing.summary(pods)
    # Capacity for the fifth arrives. Nothing touches the PodGroup or the pods: the scheduler's
    # unschedulable-pod retry (pod-max-in-unschedulable-pods-duration=10s, flushed every 30s) must place
    # the whole gang on its own.
    fifth = cfg.NodePool(count=1, gpus=1, prefix=pool_id, start=4, zones=("zone-a",),
                         extra_labels={"kubeforge.dev/pool": pool_id})
    lifecycle.add_nodes(cluster, [fifth])
    pods = testing.wait_for_pods(api_client, namespace=namespace, selector="app=gang", count=5,
                                 ok=testing.is_running_ready, what="all 5 gang pods Running", timeout_s=90)
    assert {p.spec.node_name for p in pods} == {f"{pool_id}-{i}" for i in range(5)}


@pytest.mark.parametrize(("key", "value"), [
    (cfg.ZONE_LABEL, "zone-b"),
    (cfg.RACK_LABEL, "zone-a-block-0-rack-1"),
])
def test_required_node_affinity_on_topology_label(namespace, api_client, key, value) -> None:  # type: ignore[no-untyped-def]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]}}}
    sts = testing.statefulset(name="placed", replicas=4, spec=testing.pod_spec(affinity=affinity))
    _apps(api_client).create_namespaced_stateful_set(namespace, sts)
    pods = testing.wait_for_pods(api_client, namespace=namespace, selector="app=placed", count=4,
                                 ok=testing.is_running_ready, what=f"4 pods Running with {key}={value}")
    nodes = {n.metadata.name: n.metadata.labels for n in _core(api_client).list_node().items}
    matching = {name for name, labels in nodes.items() if labels.get(key) == value}
    assert matching and matching != set(nodes), "the label must split the nodes for this test to mean anything"
    assert {p.spec.node_name for p in pods} <= matching


def _running_pod(api_client, namespace: str, name: str) -> None:  # type: ignore[no-untyped-def]
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": testing.pod_spec()}
    _core(api_client).create_namespaced_pod(namespace, body)
    testing.wait_for_pod(api_client, namespace=namespace, name=name, ok=testing.is_running_ready,
                         what=f"pod {name} Running")


def test_container_failure_pod_failed(namespace, api_client) -> None:  # type: ignore[no-untyped-def]
    _running_pod(api_client, namespace, "victim")
    patch = {"metadata": {"labels": {testing.FAIL_POD_LABEL: "true"}, "annotations": {
        testing.FAIL_POD_ANNOTATION_PREFIX + "exit-code": "137",
        testing.FAIL_POD_ANNOTATION_PREFIX + "reason": "OOMKilled"}}}
    _core(api_client).patch_namespaced_pod("victim", namespace, patch)
    pod = testing.wait_for_pod(api_client, namespace=namespace, name="victim", ok=lambda p: p.status.phase == "Failed",
                               what="pod phase Failed")
    term = pod.status.container_statuses[0].state.terminated
    assert (term.exit_code, term.reason) == (137, "OOMKilled")


def test_container_failure_restart_in_place(namespace, api_client) -> None:  # type: ignore[no-untyped-def]
    _running_pod(api_client, namespace, "crashy")
    core = _core(api_client)
    for expected, (code, reason) in enumerate([(3, "Error"), (139, "SegFault")], start=1):
        patch = {"metadata": {"labels": {testing.RESTART_LABEL: "true"}, "annotations": {
            testing.RESTART_ANNOTATION_PREFIX + "exit-code": str(code),
            testing.RESTART_ANNOTATION_PREFIX + "reason": reason}}}
        core.patch_namespaced_pod("crashy", namespace, patch)
        pod = testing.wait_for_pod(
            api_client, namespace=namespace, name="crashy",
            ok=lambda p, n=expected: (p.status.container_statuses[0].restart_count == n
                                      and testing.RESTART_LABEL not in (p.metadata.labels or {})),
            what=f"restartCount {expected} and trigger label consumed")
        status = pod.status.container_statuses[0]
        assert (status.last_state.terminated.exit_code, status.last_state.terminated.reason) == (code, reason)
        assert status.state.running is not None and pod.status.phase == "Running"
    time.sleep(2)  # the consumed label must not re-trigger: the count stays at 2
    assert core.read_namespaced_pod("crashy", namespace).status.container_statuses[0].restart_count == 2


@pytest.mark.slow
def test_up_down_cycles_leave_nothing_behind(tmp_path) -> None:
    """Five up/down cycles of a separate cluster: after each, no process names its work dir and none of
    its ports listens (ports of other programs on this shared machine are not this test's business)."""
    for i in range(5):
        config = cfg.ClusterConfig(name=f"kf-cycle-{i}", root=str(tmp_path),
                                   nodes=(cfg.NodePool(count=1),))
        cluster = lifecycle.up(config)
        ports = set(cluster.ports.values())
        assert cluster.ports["kube-apiserver"] in procs.listening_ports()
        lifecycle.down(workdir=cluster.workdir)
        assert not procs.processes_mentioning(cluster.workdir)
        assert not ports & procs.listening_ports()



@pytest.mark.slow
def test_down_stops_the_control_plane_even_when_the_node_down_fails(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A failing e2e/node/down.sh once left a cluster's apiserver, scheduler and kwok running: down must still stop
    the control plane, and then report the node's failure."""
    cluster = lifecycle.up(cfg.ClusterConfig(name="kf-nodefail", root=str(tmp_path), nodes=(cfg.NodePool(count=1),)))
    scripts = tmp_path / "node-scripts"
    scripts.mkdir()
    (scripts / "down.sh").write_text("exit 3\n")
    monkeypatch.setattr(lifecycle, "NODE_SCRIPTS", scripts)
    load = lifecycle.Cluster.load
    monkeypatch.setattr(lifecycle.Cluster, "load",
                        classmethod(lambda cls, wd: dataclasses.replace(load(wd), real_node=True)))
    ports = set(cluster.ports.values())
    with pytest.raises(subprocess.CalledProcessError):
        lifecycle.down(workdir=cluster.workdir)
    assert not procs.processes_mentioning(cluster.workdir)
    assert not ports & procs.listening_ports()
