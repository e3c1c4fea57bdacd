"""Pure builders: ClusterConfig -> kwokctl config, scheduler config, Node manifests.

Role: turn typed values into the documents the processes read; no I/O except reading the packaged stage
files. Neighbours: ``config`` (input), ``lifecycle`` (writes the output to the work dir and runs kwokctl).
Every document is rendered as JSON, which YAML parsers accept, so no YAML library is needed.
Invariants: the kwokctl config always carries the full stage set (passing any Stage replaces kwok's
defaults); flags kwokctl already sets are overridden in place, never duplicated.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any

from kfcluster import config as cfg

STAGES_DIR = pathlib.Path(__file__).with_name("stages")
STAGE_FILES = ("node.yaml", "pod.yaml", "failure.yaml")

#: Flags kwokctl 0.7.0 already passes per component (binary runtime); extra args naming one of these
#: must override in place (kwokctl appends otherwise, and a repeated flag is ambiguous).
KWOKCTL_SET_FLAGS: Mapping[str, frozenset[str]] = {
    "kube-apiserver": frozenset({
        "admission-control", "allow-privileged", "audit-log-path", "audit-policy-file", "authorization-mode",
        "bind-address", "client-ca-file", "enable-priority-and-fairness", "etcd-prefix", "etcd-servers",
        "feature-gates", "max-mutating-requests-inflight", "max-requests-inflight", "proxy-client-cert-file",
        "proxy-client-key-file", "runtime-config", "secure-port", "service-account-issuer",
        "service-account-key-file", "service-account-signing-key-file", "tls-cert-file",
        "tls-private-key-file", "tracing-config-file", "v",
    }),
    "kwok-controller": frozenset({
        # Not manage-nodes-with-annotation-selector: kwokctl 0.7.0 (binary runtime) passes only
        # --manage-all-nodes=true, and an override of an absent flag is dropped ("have not match override").
        "config", "enable-crds", "kubeconfig", "manage-all-nodes",
        "node-ip", "node-lease-duration-seconds", "node-name", "node-port", "server-address",
        "tls-cert-file", "tls-private-key-file", "v",
    }),
    "kube-controller-manager": frozenset({
        "authorization-always-allow-paths", "bind-address", "kubeconfig", "node-monitor-grace-period",
        "node-monitor-period", "root-ca-file", "secure-port", "service-account-private-key-file", "v",
    }),
    "kube-scheduler": frozenset({
        "authorization-always-allow-paths", "bind-address", "config", "feature-gates", "kube-api-burst",
        "kube-api-qps", "kubeconfig", "secure-port", "v",
    }),
}


def extra_args(component: str, flags: Mapping[str, str]) -> list[dict[str, Any]]:
    """kwokctl ``componentsPatches[].extraArgs`` entries for ``flags``."""
    known = KWOKCTL_SET_FLAGS.get(component, frozenset())
    return [{"key": k, "value": v, "override": k in known} for k, v in flags.items()]


def kwok_flags(config: cfg.ClusterConfig) -> dict[str, str]:
    """The kwok controller manages only nodes annotated as fake, so a real kubelet node can join."""
    flags = {
        "manage-all-nodes": "false",
        "manage-nodes-with-annotation-selector": f"{cfg.FAKE_NODE_ANNOTATION}={cfg.FAKE_NODE_ANNOTATION_VALUE}",
    }
    flags.update(config.extra_kwok_args)
    return flags


def apiserver_flags(config: cfg.ClusterConfig) -> dict[str, str]:
    flags: dict[str, str] = {}
    if config.apiserver_bind_address != "127.0.0.1":
        flags["bind-address"] = config.apiserver_bind_address
    flags.update(config.extra_apiserver_args)
    return flags


def scheduler_flags(config: cfg.ClusterConfig) -> dict[str, str]:
    flags = {"pod-max-in-unschedulable-pods-duration": config.unschedulable_retry}
    flags.update(config.extra_scheduler_args)
    return flags


def controller_manager_flags(config: cfg.ClusterConfig) -> dict[str, str]:
    """One controller-manager, no leader election: on a loaded machine its lease renewal (5 s deadline) timed out
    and it exited ("leaderelection lost"), leaving StatefulSets without pods for the rest of the run."""
    flags = {"leader-elect": "false"}
    flags.update(config.extra_controller_manager_args)
    return flags


def scheduler_config(config: cfg.ClusterConfig) -> dict[str, Any]:
    """KubeSchedulerConfiguration: one profile, Coscheduling in multiPoint and as the only queueSort; with
    ``scheduler: default`` the stock scheduler's default profile (no plugin named)."""
    head = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 5,
    }
    if not config.coscheduling:
        return {**head, "profiles": [{"schedulerName": "default-scheduler"}]}
    return {
        **head,
        "profiles": [{
            "schedulerName": "default-scheduler",
            "plugins": {
                "multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]},
            },
            "pluginConfig": [{
                "name": "Coscheduling",
                "args": {"permitWaitingTimeSeconds": config.permit_waiting_seconds},
            }],
        }],
    }


def kwokctl_config(*, config: cfg.ClusterConfig, bins: Mapping[str, str], ports: Mapping[str, int],
                   scheduler_config_path: str, k8s_version: str) -> dict[str, Any]:
    """The KwokctlConfiguration document (binary runtime, every binary path and port given)."""
    patches = [
        {"name": "kube-apiserver", "extraArgs": extra_args("kube-apiserver", apiserver_flags(config))},
        {"name": "kwok-controller", "extraArgs": extra_args("kwok-controller", kwok_flags(config))},
        {"name": "kube-scheduler", "extraArgs": extra_args("kube-scheduler", scheduler_flags(config))},
        {"name": "kube-controller-manager",
         "extraArgs": extra_args("kube-controller-manager", controller_manager_flags(config))},
    ]
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            "kubeVersion": k8s_version,
            "bindAddress": "127.0.0.1",
            "kubeApiserverCertSANs": list(config.apiserver_cert_sans),
            "etcdBinary": bins["etcd"],
            "kubeApiserverBinary": bins["kube-apiserver"],
            "kubeControllerManagerBinary": bins["kube-controller-manager"],
            "kubeSchedulerBinary": bins["kube-scheduler" if config.coscheduling else "kube-scheduler-stock"],
            "kubectlBinary": bins["kubectl"],
            "kwokControllerBinary": bins["kwok"],
            "kubeSchedulerConfig": scheduler_config_path,
            "etcdPort": ports["etcd"],
            "etcdPeerPort": ports["etcd-peer"],
            "kubeApiserverPort": ports["kube-apiserver"],
            "kubeControllerManagerPort": ports["kube-controller-manager"],
            "kubeSchedulerPort": ports["kube-scheduler"],
            "kwokControllerPort": ports["kwok-controller"],
            **({"disableQPSLimits": True} if config.disable_qps_limits else {}),
        },
        "componentsPatches": [p for p in patches if p["extraArgs"]],
    }


def yaml_text(obj: Any, indent: int = 0) -> str:
    """Block-style YAML for plain dicts/lists/scalars (scalars JSON-quoted, which YAML accepts).

    Needed where a tool appends YAML lines to our file (kwokctl appends ``clientConnection:`` to the
    scheduler config), so flow-style JSON would not do.
    """
    pad = "  " * indent
    lines: list[str] = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            if isinstance(value, (dict, list)) and value:
                lines.append(f"{pad}{key}:")
                lines.append(yaml_text(value, indent + 1).rstrip("\n"))
            else:
                lines.append(f"{pad}{key}: {json.dumps(value)}")
    elif isinstance(obj, list):
        for item in obj:
            body = yaml_text(item, indent + 1).rstrip("\n") if isinstance(item, (dict, list)) and item else \
                f"{pad}  {json.dumps(item)}"
            lines.append(f"{pad}- {body.lstrip()}")
    else:
        lines.append(f"{pad}{json.dumps(obj)}")
    return "\n".join(lines) + "\n"


def stages_text() -> str:
    """All kwok Stage documents, as one multi-document YAML string."""
    return "\n---\n".join(STAGES_DIR.joinpath(f).read_text() for f in STAGE_FILES)


def kwok_config(config: cfg.ClusterConfig) -> dict[str, Any] | None:
    """The KwokConfiguration document (kwokctl hands it to the kwok controller), when a kwok option is set."""
    options = {k: v for k, v in (("podPlayStageParallelism", config.kwok_pod_parallelism),
                                 ("nodeLeaseParallelism", config.kwok_node_lease_parallelism)) if v}
    if not options:
        return None
    return {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": options}


def kwokctl_config_text(doc: Mapping[str, Any], kwok: Mapping[str, Any] | None = None) -> str:
    head = json.dumps(doc, indent=1) + ("\n---\n" + json.dumps(kwok, indent=1) if kwok else "")
    return head + "\n---\n" + stages_text()


def node_labels(pool: cfg.NodePool, index: int) -> dict[str, str]:
    """Topology labels of node ``index`` (0-based within the pool) — pure, so tests can predict them."""
    zone = pool.zones[index % len(pool.zones)]
    within = index // len(pool.zones)  # position of this node inside its zone
    block = within % pool.blocks_per_zone
    rack = (within // pool.blocks_per_zone) % pool.racks_per_block
    labels = {
        cfg.ZONE_LABEL: zone,
        cfg.BLOCK_LABEL: f"{zone}-block-{block}",
        cfg.RACK_LABEL: f"{zone}-block-{block}-rack-{rack}",
        cfg.KWOK_NODE_LABEL: cfg.KWOK_NODE_LABEL_VALUE,
    }
    labels.update(pool.extra_labels)
    return labels


def node_manifest(pool: cfg.NodePool, index: int) -> dict[str, Any]:
    """A simulated GPU node: annotated for kwok, tainted as kwok nodes are, capacity in its status."""
    name = f"{pool.prefix}-{pool.start + index}"
    resources = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.pods)}
    if pool.gpus:
        resources[cfg.GPU_RESOURCE] = str(pool.gpus)
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              **node_labels(pool, index)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {cfg.FAKE_NODE_ANNOTATION: cfg.FAKE_NODE_ANNOTATION_VALUE,
                            "node.alpha.kubernetes.io/ttl": "0"},
            "labels": labels,
        },
        "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
        "status": {"allocatable": resources, "capacity": resources},
    }


def node_list(pools: Iterable[cfg.NodePool]) -> dict[str, Any]:
    items = [node_manifest(p, i) for p in pools for i in range(p.count)]
    return {"apiVersion": "v1", "kind": "List", "items": items}
