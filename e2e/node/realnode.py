"""The real test node, seen from Python: its fixed facts, whether it is up, and pod parts to run our venv.

Role: the Python face of ``e2e/node/*.sh``. Tests (``e2e/test_realnode_smoke.py``, the RLJob e2e test) use
``status``/``require_up`` to know the node is usable and ``venv_python_parts`` to put the hostPath
volumes, mounts and env that run the project's venv Python into a pod (or an RLJob role template).
``cluster_overrides`` lists the control-plane settings a cluster with a real node needs (kfcluster
applies them when ``real_node`` is on).

Neighbours: the shell scripts (``up.sh`` / ``down.sh`` own the processes; the constants below must match
``lib.sh``), ``kfcluster.kube.Kubectl`` (the only kubectl wrapper), ``images/base`` (busybox rootfs with
``/lib/<multiarch>`` and ``/lib64`` mount points).

Invariants: pure functions except ``status``/``require_up`` (one kubectl call each); every hostPath
volume is read-only; the node's address is the bridge ``kf0`` (10.88.0.1), never an external interface.
"""

# No `from __future__ import annotations`: kfcluster loads this file by path without registering it in
# sys.modules, and dataclasses then cannot resolve string annotations.
import contextlib
import dataclasses
import fcntl
import os
import pathlib
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

#: Must match e2e/node/lib.sh.
NODE_NAME = "kf-real-0"
#: More real nodes (extra-node.sh): node i is ``kf-real-<i>`` with pods in 10.(88+i).0.0/16, at most this many.
MAX_REAL_NODES = 4
HOSTNAME_LABEL = "kubernetes.io/hostname"
NODE_LABEL = "kubeforge.dev/real-node"
NODE_IP = "10.88.0.1"
POD_CIDR = "10.88.0.0/16"
BASE_IMAGE = "kubeforge.local/base:1"
PAUSE_IMAGE = "kubeforge.local/pause:1"
#: Service range of a cluster with a real node; its first address is the ``kubernetes`` Service.
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"
SCRIPTS_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = SCRIPTS_DIR.parent.parent


class KubectlLike(Protocol):
    """What ``status`` needs from ``kfcluster.kube.Kubectl``."""

    def get_json(self, *args: str) -> Any: ...


def cluster_overrides(*, workdir: str, name: str) -> dict[str, Any]:
    """``ClusterConfig`` fields for a cluster that gets a real node.

    The apiserver listens on all addresses (its own controllers use loopback) and advertises the bridge
    address, so the ``kubernetes`` Service leads pods to 10.88.0.1; its certificate names the bridge
    address and the Service IP; ``kubectl logs/exec`` reach the kubelet with kwokctl's admin client cert.
    """
    pki = f"{workdir}/kwok/clusters/{name}/pki"
    return {
        "apiserver_bind_address": "0.0.0.0",
        "apiserver_cert_sans": (NODE_IP, SERVICE_IP),
        "extra_apiserver_args": {
            "advertise-address": NODE_IP,
            "service-cluster-ip-range": SERVICE_CIDR,
            "kubelet-client-certificate": f"{pki}/admin.crt",
            "kubelet-client-key": f"{pki}/admin.key",
            "kubelet-preferred-address-types": "InternalIP,Hostname",
        },
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeStatus:
    """Whether the real node can run pods now, and why not when it cannot."""

    up: bool
    reason: str


def node_status_from(node: dict[str, Any] | None) -> NodeStatus:
    """Judge a Node object (``None``: absent). Pure; ``status`` fetches the object."""
    if node is None:
        return NodeStatus(up=False, reason=f"node {NODE_NAME} does not exist (start with `make cluster-up REAL_NODE=1`)")
    labels = node.get("metadata", {}).get("labels", {})
    if labels.get(NODE_LABEL) != "true":
        return NodeStatus(up=False, reason=f"node {NODE_NAME} lacks label {NODE_LABEL}=true")
    if any(t.get("key") == KWOK_TAINT_KEY for t in node.get("spec", {}).get("taints", []) or []):
        return NodeStatus(up=False, reason=f"node {NODE_NAME} carries the kwok taint")
    if node.get("spec", {}).get("unschedulable"):
        return NodeStatus(up=False, reason=f"node {NODE_NAME} is cordoned")
    ready = [c for c in node.get("status", {}).get("conditions", []) if c.get("type") == "Ready"]
    if not ready or ready[0].get("status") != "True":
        return NodeStatus(up=False, reason=f"node {NODE_NAME} is not Ready: {ready[0].get('message') if ready else 'no condition'}")
    return NodeStatus(up=True, reason="Ready")


def status(kubectl: KubectlLike) -> NodeStatus:
    """Fetch the real node and judge it; never raises for an absent node or an unreachable cluster."""
    try:
        items = kubectl.get_json("nodes", "-l", f"{NODE_LABEL}=true")["items"]
    except (RuntimeError, OSError, ValueError, KeyError) as exc:
        return NodeStatus(up=False, reason=f"cluster unreachable: {exc}")
    return node_status_from(next((n for n in items if n["metadata"]["name"] == NODE_NAME), None))


def is_up(kubectl: KubectlLike) -> bool:
    return status(kubectl).up


def node_name(index: int) -> str:
    """The name of real node ``index`` (0 = the root network namespace's node)."""
    if not 0 <= index < MAX_REAL_NODES:
        raise ValueError(f"real node index must be 0..{MAX_REAL_NODES - 1}, got {index}")
    return f"kf-real-{index}"


def node_pod_prefix(index: int) -> str:
    """The first two octets (with the dot) of real node ``index``'s pod addresses, e.g. ``10.89.``."""
    node_name(index)
    return f"10.{88 + index}."


def ready_real_nodes(kubectl: KubectlLike) -> list[str]:
    """Names of the real nodes that are Ready, sorted; [] when the cluster cannot be read."""
    try:
        items = kubectl.get_json("nodes", "-l", f"{NODE_LABEL}=true")["items"]
    except (RuntimeError, OSError, ValueError, KeyError):
        return []
    return sorted(n["metadata"]["name"] for n in items if node_status_from_named(n).up)


def node_status_from_named(node: dict[str, Any]) -> NodeStatus:
    """``node_status_from`` for any real node (the messages name it)."""
    name = node.get("metadata", {}).get("name", "?")
    judged = node_status_from(node)
    return dataclasses.replace(judged, reason=judged.reason.replace(NODE_NAME, name))


def cannot_host_nodes(count: int, *, proc: pathlib.Path = pathlib.Path("/proc"),
                      cgroup: pathlib.Path = pathlib.Path("/sys/fs/cgroup"), euid: int | None = None) -> str | None:
    """Why this machine cannot run ``count`` real nodes, or None when it can (checked before starting them).

    Node 1 and up need root, network namespaces with veth pairs (``ip netns``), ``nsenter``, cgroups to create
    their cgroupRoot in, and about 300 MiB of memory each beside the rest of the cluster.
    """
    import shutil  # noqa: PLC0415 (only this check needs it)

    if count <= 1:
        return None
    if count > MAX_REAL_NODES:
        return f"at most {MAX_REAL_NODES} real nodes (pod ranges 10.88-10.91), asked {count}"
    if (os.geteuid() if euid is None else euid) != 0:
        return "real nodes need root (network namespaces, veth pairs, cgroups, mounts)"
    for tool in ("ip", "nsenter"):
        if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None:
            return f"`{tool}` is not installed"
    if not (proc / "self" / "ns" / "net").exists():
        return "the kernel has no network namespaces"
    if not os.access(cgroup, os.W_OK) and not any(os.access(d, os.W_OK) for d in cgroup.glob("*/")):
        return f"{cgroup} is not writable (cannot create the nodes' cgroupRoot)"
    try:
        meminfo = dict(line.split(":", 1) for line in (proc / "meminfo").read_text().splitlines() if ":" in line)
        avail_mib = int(meminfo["MemAvailable"].split()[0]) // 1024
    except (OSError, KeyError, ValueError):
        return None
    need = 1024 + 300 * count
    if avail_mib < need:
        return f"{avail_mib} MiB of memory available, {need} MiB needed for {count} real nodes and the control plane"
    return None


#: kube-controller-manager's own defaults (Kubernetes 1.34) for the node lifecycle controller
NODE_MONITOR_DEFAULTS = {"node-monitor-grace-period": 40.0, "node-monitor-period": 5.0}


def go_duration_s(text: str) -> float:
    """Seconds of a Go duration as flags print them (``3m20s``, ``40s``, ``1h0m0s``, ``500ms``)."""
    import re  # noqa: PLC0415 (only this parser needs it)

    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(ms|us|µs|ns|h|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"not a Go duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def node_monitor(workdir: str, *, proc: pathlib.Path = pathlib.Path("/proc")) -> dict[str, float]:
    """``node-monitor-grace-period`` and ``node-monitor-period`` (seconds) of the kube-controller-manager running
    for the cluster in ``workdir`` (its command line, which names files under the workdir); the defaults for a
    flag it does not set. How long a lost node takes to read NotReady: grace, plus up to one period."""
    out = dict(NODE_MONITOR_DEFAULTS)
    mine = workdir.rstrip("/") + "/"
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not args or not args[0].endswith("kube-controller-manager") or not any(mine in a for a in args):
            continue
        for a in args:
            flag, _, value = a.removeprefix("--").partition("=")
            if flag in out and value:
                out[flag] = go_duration_s(value)
        break
    return out


#: One set of real nodes per machine: every run that holds one (``make e2e-nodes``, ``flock ... pytest`` runs, the
#: cluster fault campaign) holds this lock for its whole run.
REAL_NODE_LOCK = pathlib.Path("/tmp/kubeforge-realnode.lock")


def _lock_holders(path: pathlib.Path, *, proc: pathlib.Path) -> list[str]:
    """``pid (command line)`` of the processes ``/proc/locks`` names as holding a lock on ``path`` (for a message)."""
    try:
        ino = path.stat().st_ino
        lines = (proc / "locks").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()          # "1: FLOCK  ADVISORY  WRITE 4855 fe:00:10149898 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(ino):
            pid = fields[4]
            try:
                cmd = (proc / pid / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                cmd = "exited; a child holds it"
            out.append(f"pid {pid} ({cmd[:200]})")
    return out


@contextlib.contextmanager
def real_node_lock(*, wait_s: float, path: pathlib.Path = REAL_NODE_LOCK, proc: pathlib.Path = pathlib.Path("/proc"),
                   poll_s: float = 2.0, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the real-node lock (``flock``, exclusive) while the block runs, as ``flock /tmp/kubeforge-realnode.lock
    CMD`` does for the Makefile's targets; waits for it at most ``wait_s`` seconds, then raises ``SystemExit`` naming
    the holder. Run under such a ``flock`` already (its descriptor inherited), the lock is this process's: no wait."""
    fd = None
    for entry in (proc / "self" / "fd").glob("*"):        # an inherited descriptor of the lock file: its lock is ours
        try:
            if entry.resolve() == path.resolve():
                fd = int(entry.name)
                break
        except (OSError, ValueError):
            continue
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + wait_s
    told = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holders = ", ".join(_lock_holders(path, proc=proc)) or "another process"
                if time.monotonic() >= deadline:
                    raise SystemExit(
                        f"the real-node lock {path} is held by {holders} for more than {wait_s:.0f}s: one run with "
                        f"real nodes per machine; wait for it to end (or set KF_REAL_NODE_WAIT_S to wait longer)")
                if not told and say is not None:
                    say(f"waiting up to {wait_s:.0f}s for the real-node lock {path} (held by {holders})")
                    told = True
                time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        yield
    finally:
        if own:
            os.close(fd)           # closing the only descriptor releases the lock


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodParts:
    """Pieces of a pod spec that run the project's venv Python inside the busybox base image."""

    python: str
    volumes: list[dict[str, Any]]
    volume_mounts: list[dict[str, Any]]
    env: list[dict[str, str]]
    image: str = BASE_IMAGE


def _venv_home(venv: pathlib.Path) -> pathlib.Path:
    """The base Python installation's prefix, from the venv's pyvenv.cfg (``home`` is its bin dir)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return pathlib.Path(value.strip()).resolve().parent
    raise ValueError(f"{venv}/pyvenv.cfg has no 'home' line")


def _outermost(paths: list[pathlib.Path]) -> list[pathlib.Path]:
    """Drop paths inside another listed path (one mount covers them), keep order."""
    keep: list[pathlib.Path] = []
    for p in paths:
        if any(p != q and p.is_relative_to(q) for q in paths) or p in keep:
            continue
        keep.append(p)
    return keep


def venv_python_parts(*, venv: pathlib.Path | None = None, repo: pathlib.Path | None = None,
                      multiarch: str | None = None) -> PodParts:
    """hostPath volumes/mounts (read-only, same paths as on the host) and env for running the venv's Python.

    Mounted: the base Python installation, the repo (editable installs point into it) and the venv when
    it lives outside the repo, at their host paths; ``/usr/lib/<multiarch>`` at ``/lib/<multiarch>`` and
    ``/usr/lib64`` at ``/lib64`` (the dynamic loader and libc, ssl, ... the base image lacks).

    A checkout without its own ``.venv`` (a git worktree; neither ``venv`` nor ``repo`` given): the pods run the
    running interpreter's venv (``sys.prefix``), whose editable install points at another checkout, with this
    checkout mounted too and its sources first on ``PYTHONPATH``, so the pods run this checkout's code.
    """
    worktree = venv is None and repo is None and not (REPO_ROOT / ".venv").is_dir()
    if worktree:
        venv = pathlib.Path(sys.prefix)
        repo = venv.parent
    repo = (repo or REPO_ROOT).resolve()
    venv = (venv or repo / ".venv").absolute()
    multiarch = multiarch or sysconfig.get_config_var("MULTIARCH") or "x86_64-linux-gnu"
    same_path = _outermost([_venv_home(venv), repo, venv, *([REPO_ROOT.resolve()] if worktree else [])])
    pairs = [(str(p), str(p)) for p in same_path]
    pairs += [(f"/usr/lib/{multiarch}", f"/lib/{multiarch}"), ("/usr/lib64", "/lib64")]
    volumes, mounts = [], []
    for i, (host, inside) in enumerate(pairs):
        name = f"kf-host-{i}"
        volumes.append({"name": name, "hostPath": {"path": host, "type": "Directory"}})
        mounts.append({"name": name, "mountPath": inside, "readOnly": True})
    env = [
        {"name": "PATH", "value": f"{venv}/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"},
        {"name": "VIRTUAL_ENV", "value": str(venv)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": "/tmp"},
    ]
    if worktree:
        env.append({"name": "PYTHONPATH",
                    "value": ":".join(str(REPO_ROOT.resolve() / d) for d in ("api", "operator", "runtime"))})
    return PodParts(python=f"{venv}/bin/python", volumes=volumes, volume_mounts=mounts, env=env)


# The real node is tainted (e2e/node/configs.sh registerWithTaints) so pods meant for kwok nodes stay off it.
REAL_NODE_TOLERATION = {"key": NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def on_real_node(pod_spec: dict[str, Any], *, node: str | None = None) -> dict[str, Any]:
    """Return ``pod_spec`` pinned to the real node (nodeSelector on its label, toleration of its taint); input left
    unchanged. ``node``: pinned to that real node by its hostname label (clusters with more than one)."""
    spec = dict(pod_spec)
    spec["nodeSelector"] = {**pod_spec.get("nodeSelector", {}), NODE_LABEL: "true",
                            **({HOSTNAME_LABEL: node} if node else {})}
    spec["tolerations"] = [*pod_spec.get("tolerations", []), dict(REAL_NODE_TOLERATION)]
    return spec


if __name__ == "__main__":  # debugging aid: print the pod parts for this checkout
    import json

    print(json.dumps(dataclasses.asdict(venv_python_parts()), indent=1), file=sys.stdout)
