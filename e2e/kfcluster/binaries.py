"""Where the cluster's binaries live and whether they are built.

Role: read the pinned versions (e2e/build/versions.env), resolve the versioned cache directory the build
script writes, and build what is missing by calling e2e/build/build.sh. Neighbours: ``lifecycle`` asks
for ``require(...)``; the build script owns compilation and the cache layout.
Invariant: a binary is used only if its stamp names the pinned version (the build script writes the
stamp after an atomic rename), so a half-written binary is never trusted.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Iterable, Mapping

E2E_DIR = pathlib.Path(__file__).resolve().parent.parent
BUILD_SCRIPT = E2E_DIR / "build" / "build.sh"
VERSIONS_FILE = E2E_DIR / "build" / "versions.env"
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "kube-scheduler", "kwok", "kwokctl")
#: The control plane of ``make cluster-up SCHEDULER=default``: the stock kube-scheduler instead of the Coscheduling one.
STOCK_CONTROL_PLANE = tuple("kube-scheduler-stock" if n == "kube-scheduler" else n for n in CONTROL_PLANE)


def versions(path: pathlib.Path = VERSIONS_FILE) -> dict[str, str]:
    """``KEY=value`` lines of versions.env (comments and blanks skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def cache_dir(env: Mapping[str, str] | None = None) -> pathlib.Path:
    env = os.environ if env is None else env
    root = env.get("KUBEFORGE_CACHE") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME", "/root"), ".cache"), "kubeforge")
    return pathlib.Path(root) / f"k8s-{versions()['K8S_VERSION']}"


def bin_dir() -> pathlib.Path:
    return cache_dir() / "bin"


def podgroup_crd() -> pathlib.Path:
    return cache_dir() / "share" / "crds" / "scheduling.x-k8s.io_podgroups.yaml"


def expected_version(name: str) -> str:
    v = versions()
    if name == "etcd":
        return v["ETCD_VERSION"]
    if name in ("kwok", "kwokctl"):
        return v["KWOK_VERSION"]
    if name == "helm":
        return v["HELM_VERSION"]
    if name == "coredns":
        return v["COREDNS_VERSION"]
    if name == "registry":
        return v["REGISTRY_VERSION"]
    if name == "kube-router":
        return v["KUBE_ROUTER_VERSION"]
    if name == "kueue":
        return v["KUEUE_VERSION"]
    if name == "kube-scheduler":
        return f"{v['K8S_VERSION']}+scheduler-plugins-{v['SCHEDULER_PLUGINS_VERSION']}"
    return v["K8S_VERSION"]


def missing(names: Iterable[str]) -> list[str]:
    """Components whose binary or version stamp is absent or stale."""
    out = []
    for name in names:
        binary, stamp = bin_dir() / name, bin_dir() / ".stamp" / name
        ok = binary.is_file() and os.access(binary, os.X_OK) and stamp.is_file()
        if not ok or stamp.read_text().strip() != expected_version(name):
            out.append(name)
    return out


def control_plane(scheduler: str) -> tuple[str, ...]:
    """The control-plane components of a cluster whose ``ClusterConfig.scheduler`` is ``scheduler``."""
    return STOCK_CONTROL_PLANE if scheduler == "default" else CONTROL_PLANE


def require(names: Iterable[str] = CONTROL_PLANE, *, build: bool = True) -> dict[str, str]:
    """Paths of ``names``; builds the missing ones via build.sh when ``build`` (else raises). The PodGroup CRD
    is required with the Coscheduling ``kube-scheduler`` only."""
    names = list(names)
    absent = missing(names)
    if absent or ("kube-scheduler" in names and not podgroup_crd().is_file()):
        if not build:
            raise FileNotFoundError(
                f"not built: {', '.join(absent) or 'PodGroup CRD'} (run `make build-cluster` or "
                f"{BUILD_SCRIPT} {' '.join(absent)})")
        subprocess.run(["bash", str(BUILD_SCRIPT), *(absent or ["kube-scheduler"])], check=True)
    return {n: str(bin_dir() / n) for n in names}
