"""Typed configuration of the test cluster: simulated node pools and control-plane knobs.

Role: the one place where defaults live (4 kwok nodes x 8 ``nvidia.com/gpu`` in 2 zones, apiserver on
127.0.0.1) and where environment variables are read (``from_env``). Neighbours: ``render`` turns these
values into manifests and the kwokctl config; ``lifecycle`` starts and stops processes.
Invariants: every config is validated at construction (``ValueError`` names the field); configs are
frozen, so a running cluster's description never changes under it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

#: Topology label keys put on simulated nodes. The zone key is the well-known Kubernetes one.
ZONE_LABEL = "topology.kubernetes.io/zone"
BLOCK_LABEL = "topology.kubeforge.dev/block"
RACK_LABEL = "topology.kubeforge.dev/rack"
#: Annotation that tells the kwok controller a node is simulated (it manages only those).
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
FAKE_NODE_ANNOTATION_VALUE = "fake"
#: Label every simulated node gets, so tests can select them.
KWOK_NODE_LABEL = "type"
KWOK_NODE_LABEL_VALUE = "kwok"
GPU_RESOURCE = "nvidia.com/gpu"
#: ``ClusterConfig.scheduler`` values. ``coscheduling``: the kube-scheduler built with scheduler-plugins'
#: Coscheduling, and the PodGroup CRD installed (the default). ``default``: the stock kube-scheduler of
#: k8s.io/kubernetes with its default profile and no PodGroup CRD: the cluster a user brings who runs neither
#: Coscheduling nor Kueue (``make cluster-up SCHEDULER=default``).
SCHEDULER_COSCHEDULING = "coscheduling"
SCHEDULER_DEFAULT = "default"
SCHEDULERS = (SCHEDULER_COSCHEDULING, SCHEDULER_DEFAULT)

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodePool:
    """A group of identical simulated (kwok) nodes.

    Node ``i`` of the pool is named ``{prefix}-{start + i}`` and gets zone ``zones[i % len(zones)]``;
    blocks and racks subdivide each zone (``blocks_per_zone``, ``racks_per_block``), so labels are stable
    and predictable from the index alone.
    """

    count: int = 4
    gpus: int = 8
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110
    prefix: str = "kwok-gpu"
    start: int = 0
    zones: tuple[str, ...] = ("zone-a", "zone-b")
    blocks_per_zone: int = 1
    racks_per_block: int = 2
    extra_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count < 0:
            raise ValueError(f"NodePool.count must be >= 0, got {self.count}")
        if self.gpus < 0:
            raise ValueError(f"NodePool.gpus must be >= 0, got {self.gpus}")
        if self.start < 0:
            raise ValueError(f"NodePool.start must be >= 0, got {self.start}")
        if not self.zones:
            raise ValueError("NodePool.zones must name at least one zone")
        if self.blocks_per_zone < 1 or self.racks_per_block < 1:
            raise ValueError("NodePool.blocks_per_zone and NodePool.racks_per_block must be >= 1")
        if not _NAME_RE.match(self.prefix):
            raise ValueError(f"NodePool.prefix must be a DNS label, got {self.prefix!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """Everything ``lifecycle.up`` needs to start one cluster.

    ``apiserver_bind_address``: 127.0.0.1 (default) or 0.0.0.0 — the controllers always talk to the
    apiserver over loopback, so it cannot listen on a single non-loopback address; 0.0.0.0 makes it
    reachable from pods at a bridge address (add that address to ``apiserver_cert_sans`` and use it as
    ``kubeconfig_server``). ``extra_apiserver_args`` / ``extra_kwok_args`` / ``extra_scheduler_args`` /
    ``extra_controller_manager_args`` are flag name -> value (without ``--``); a flag kwokctl already sets is overridden, others appended.
    """

    name: str = "kubeforge"
    root: str = "/tmp/kubeforge-clusters"
    apiserver_bind_address: str = "127.0.0.1"
    apiserver_cert_sans: tuple[str, ...] = ()
    kubeconfig_server: str = ""
    extra_apiserver_args: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_kwok_args: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extra_scheduler_args: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: kube-controller-manager flags, e.g. ``kube-api-qps`` (its client defaults to 20 requests/s, which caps how
    #: fast StatefulSets create pods: 10,000 pods take 500 s at that rate).
    extra_controller_manager_args: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: kwokctl's ``disableQPSLimits``: the controller-manager and the scheduler talk to the API server at up to
    #: 5,000 requests/s instead of 20 and 50, and the API server's in-flight limits and priority-and-fairness are
    #: off. For scale runs (bench/bench_operator.py); the default keeps upstream's limits.
    disable_qps_limits: bool = False
    #: kwok's ``podPlayStageParallelism`` (pods it moves through their stages at once; kwok's default is 4, which
    #: makes a burst of thousands of pod creations or deletions wait on kwok). 0 keeps kwok's default.
    kwok_pod_parallelism: int = 0
    #: kwok's ``nodeLeaseParallelism`` (node leases renewed at once; default 4: at 1,000 nodes on a loaded machine
    #: leases lapsed and the node-lifecycle controller marked nodes and their pods NotReady). 0 keeps kwok's default.
    kwok_node_lease_parallelism: int = 0
    #: How long the scheduler leaves a pod in its unschedulable queue before retrying it regardless of
    #: events. Coscheduling re-queues on Pod/PodGroup events only, never on a new Node, so a gang waiting
    #: for capacity would otherwise wait up to the default 5 minutes after the capacity appears.
    unschedulable_retry: str = "10s"
    #: Coscheduling: how long pods of an incomplete gang wait at Permit before they are rejected.
    permit_waiting_seconds: int = 30
    nodes: tuple[NodePool, ...] = (NodePool(),)
    ready_timeout_s: float = 120.0
    real_node: bool = False
    #: How many real nodes ``e2e/node/up.sh`` starts when ``real_node`` is on (1..4; ``KF_REAL_NODES``): node 0 in
    #: the root network namespace, the others each in its own (docs/real-node.md, "More than one node").
    real_nodes: int = 1
    #: start Kueue's manager beside the control plane (``make cluster-up KUEUE=1``; kfcluster/kueue.py)
    kueue: bool = False
    #: which kube-scheduler runs (``SCHEDULERS``; ``KF_SCHEDULER``, ``make cluster-up SCHEDULER=default``)
    scheduler: str = SCHEDULER_COSCHEDULING

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"ClusterConfig.scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}")
        if not 1 <= self.real_nodes <= 4:
            raise ValueError(f"ClusterConfig.real_nodes must be 1..4, got {self.real_nodes}")
        if not _NAME_RE.match(self.name):
            raise ValueError(f"ClusterConfig.name must be a DNS label, got {self.name!r}")
        if self.apiserver_bind_address not in ("127.0.0.1", "0.0.0.0"):
            raise ValueError(
                "ClusterConfig.apiserver_bind_address must be 127.0.0.1 or 0.0.0.0 (the control plane's "
                f"own clients use loopback), got {self.apiserver_bind_address!r}"
            )
        if self.kubeconfig_server and not self.kubeconfig_server.startswith("https://"):
            raise ValueError(f"ClusterConfig.kubeconfig_server must be an https:// URL, got {self.kubeconfig_server!r}")
        if self.permit_waiting_seconds < 1:
            raise ValueError("ClusterConfig.permit_waiting_seconds must be >= 1")
        if self.kwok_pod_parallelism < 0 or self.kwok_node_lease_parallelism < 0:
            raise ValueError("ClusterConfig.kwok_pod_parallelism and kwok_node_lease_parallelism must be >= 0")
        if self.ready_timeout_s <= 0:
            raise ValueError("ClusterConfig.ready_timeout_s must be > 0")

    @property
    def coscheduling(self) -> bool:
        """Whether the scheduler runs Coscheduling (and the PodGroup CRD is installed)."""
        return self.scheduler == SCHEDULER_COSCHEDULING

    @property
    def workdir(self) -> str:
        """Directory holding everything of this cluster (see docs/test-cluster.md)."""
        return os.path.join(self.root, self.name)


def _flags(text: str, *, field: str) -> dict[str, str]:
    """Parse ``"a=1,b=x=y"`` / whitespace separated ``key=value`` flags (value may contain ``=``)."""
    out: dict[str, str] = {}
    for item in re.split(r"[,\s]+", text.strip()):
        if not item:
            continue
        key, sep, value = item.lstrip("-").partition("=")
        if not sep or not key:
            raise ValueError(f"{field}: expected key=value, got {item!r}")
        out[key] = value
    return out


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer, got {raw!r}") from None


def node_pool_from_env(env: Mapping[str, str]) -> NodePool:
    """The default pool, with ``KF_NODES``, ``KF_GPUS_PER_NODE``, ``KF_NODE_CPU``, ``KF_NODE_MEMORY``,
    ``KF_ZONES`` (comma list), ``KF_BLOCKS_PER_ZONE``, ``KF_RACKS_PER_BLOCK`` applied."""
    base = NodePool()
    zones = tuple(z for z in env.get("KF_ZONES", "").split(",") if z) or base.zones
    return NodePool(
        count=_int(env, "KF_NODES", base.count),
        gpus=_int(env, "KF_GPUS_PER_NODE", base.gpus),
        cpu=env.get("KF_NODE_CPU") or base.cpu,
        memory=env.get("KF_NODE_MEMORY") or base.memory,
        zones=zones,
        blocks_per_zone=_int(env, "KF_BLOCKS_PER_ZONE", base.blocks_per_zone),
        racks_per_block=_int(env, "KF_RACKS_PER_BLOCK", base.racks_per_block),
    )


def from_env(env: Mapping[str, str] | None = None, **overrides: object) -> ClusterConfig:
    """Build a ``ClusterConfig`` from ``KF_*`` / ``KUBEFORGE_*`` environment variables (documented in
    docs/test-cluster.md); keyword ``overrides`` win over the environment."""
    env = os.environ if env is None else env
    base = ClusterConfig()
    sans = tuple(s for s in env.get("KF_APISERVER_CERT_SANS", "").split(",") if s)
    values: dict[str, object] = {
        "name": env.get("KF_CLUSTER_NAME") or base.name,
        "root": env.get("KF_CLUSTER_ROOT") or base.root,
        "apiserver_bind_address": env.get("KF_APISERVER_BIND_ADDRESS") or base.apiserver_bind_address,
        "apiserver_cert_sans": sans,
        "kubeconfig_server": env.get("KF_KUBECONFIG_SERVER", ""),
        "extra_apiserver_args": _flags(env.get("KF_APISERVER_EXTRA_ARGS", ""), field="KF_APISERVER_EXTRA_ARGS"),
        "extra_kwok_args": _flags(env.get("KF_KWOK_EXTRA_ARGS", ""), field="KF_KWOK_EXTRA_ARGS"),
        "extra_scheduler_args": _flags(env.get("KF_SCHEDULER_EXTRA_ARGS", ""), field="KF_SCHEDULER_EXTRA_ARGS"),
        "extra_controller_manager_args": _flags(env.get("KF_CONTROLLER_MANAGER_EXTRA_ARGS", ""),
                                                field="KF_CONTROLLER_MANAGER_EXTRA_ARGS"),
        "disable_qps_limits": env.get("KF_DISABLE_QPS_LIMITS", "") in ("1", "true", "yes"),
        "kwok_pod_parallelism": _int(env, "KF_KWOK_POD_PARALLELISM", base.kwok_pod_parallelism),
        "nodes": (node_pool_from_env(env),),
        "real_node": env.get("KUBEFORGE_REAL_NODE", "") in ("1", "true", "yes"),
        "real_nodes": _int(env, "KF_REAL_NODES", base.real_nodes),
        "kueue": env.get("KUBEFORGE_KUEUE", "") in ("1", "true", "yes"),
        "scheduler": env.get("KF_SCHEDULER") or base.scheduler,
    }
    values.update(overrides)
    return ClusterConfig(**values)  # type: ignore[arg-type]
