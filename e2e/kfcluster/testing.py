"""Helpers for tests on the test cluster: manifest builders for pods that land on kwok nodes, and waits
with clear timeouts (every failure says what was awaited and what was last seen).

Role: test-side vocabulary shared by e2e/ and operator integration tests. Neighbours: ``fixtures``
(provides ``api_client`` / ``namespace``), ``config`` (label keys), stages/failure.yaml (the failure
trigger labels and annotations below).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kfcluster import config as cfg
from kfcluster import kube

#: Toleration every pod meant for a simulated node needs (kwok nodes carry this NoSchedule taint).
KWOK_TOLERATION: dict[str, str] = {"key": "kwok.x-k8s.io/node", "operator": "Equal", "value": "fake",
                                   "effect": "NoSchedule"}
#: kwok's chaos stage: container terminated with the annotated exit code/reason, pod phase Failed.
FAIL_POD_LABEL = "pod-container-running-failed.stage.kwok.x-k8s.io"
FAIL_POD_ANNOTATION_PREFIX = "pod-container-running-failed.stage.kwok.x-k8s.io/"
#: kubelet-like: container restarted in place (restartCount + 1, lastState.terminated); label consumed.
RESTART_LABEL = "container-restart.stage.kubeforge.dev"
RESTART_ANNOTATION_PREFIX = "container-restart.stage.kubeforge.dev/"
PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def api_number(value: Any, *, field: str = "value") -> float:
    """A number read back from the API server, as a float.

    JSON has one number type, so the API server returns ``1`` for a status field we wrote as ``1.0``: tests compare
    such values as numbers, never by Python type (``isinstance(x, float)`` failed whenever a run's mean reward was
    exactly 1.0). Raises ``AssertionError`` for anything that is not a JSON number (booleans included).
    """
    assert isinstance(value, (int, float)) and not isinstance(value, bool), f"{field}: not a number: {value!r}"
    return float(value)


def pod_spec(*, gpus: int = 0, cpu: str = "100m", node_selector: Mapping[str, str] | None = None,
             affinity: Mapping[str, Any] | None = None, restart_policy: str = "Always") -> dict[str, Any]:
    """A one-container pod spec that can only run on a kwok node (tolerates its taint, selects it)."""
    limits: dict[str, str] = {"cpu": cpu}
    if gpus:
        limits[cfg.GPU_RESOURCE] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "kubeforge/test:none", "resources": {"limits": limits,
                                                                                      "requests": limits}}],
        "tolerations": [KWOK_TOLERATION],
        "nodeSelector": {cfg.KWOK_NODE_LABEL: cfg.KWOK_NODE_LABEL_VALUE, **(node_selector or {})},
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 0,
    }
    if affinity:
        spec["affinity"] = dict(affinity)
    return spec


def statefulset(*, name: str, replicas: int, spec: Mapping[str, Any],
                labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    labels = {"app": name, **(labels or {})}
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": labels}, "spec": dict(spec)}},
    }


def podgroup(*, name: str, min_member: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": min_member, "scheduleTimeoutSeconds": 600}}


def wait_for_service_account(api_client: Any, *, namespace: str, timeout_s: float = 30.0) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    kube.wait_for(f"ServiceAccount {namespace}/default",
                  lambda: core.read_namespaced_service_account("default", namespace), timeout_s=timeout_s)


def list_pods(api_client: Any, *, namespace: str, selector: str = "") -> list[Any]:
    from kubernetes import client

    return list(client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector).items)


def summary(pods: list[Any]) -> list[tuple[str, str, str | None]]:
    """(name, phase, node) per pod: what a timeout message shows."""
    return [(p.metadata.name, p.status.phase, p.spec.node_name) for p in pods]


def wait_for_pods(api_client: Any, *, namespace: str, selector: str, count: int,
                  ok: Callable[[Any], bool], what: str, timeout_s: float = 60.0) -> list[Any]:
    """Wait until exactly ``count`` pods match ``selector`` and all satisfy ``ok``; return them."""
    last: list[Any] = []

    def probe() -> list[Any] | None:
        nonlocal last
        last = list_pods(api_client, namespace=namespace, selector=selector)
        return last if len(last) == count and all(ok(p) for p in last) else None

    try:
        return kube.wait_for(what, probe, timeout_s=timeout_s)
    except kube.WaitTimeout as exc:
        raise kube.WaitTimeout(f"{exc}; pods: {summary(last)}") from None


def is_running_ready(pod: Any) -> bool:
    conds = {c.type: c.status for c in (pod.status.conditions or [])}
    return pod.status.phase == "Running" and conds.get("Ready") == "True"


def wait_for_pod(api_client: Any, *, namespace: str, name: str, ok: Callable[[Any], bool], what: str,
                 timeout_s: float = 60.0) -> Any:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    last: Any = None

    def probe() -> Any:
        nonlocal last
        last = core.read_namespaced_pod(name, namespace)
        return last if ok(last) else None

    try:
        return kube.wait_for(what, probe, timeout_s=timeout_s)
    except kube.WaitTimeout as exc:
        status = last.status.to_dict() if last is not None else None
        raise kube.WaitTimeout(f"{exc}; pod status: {status}") from None
