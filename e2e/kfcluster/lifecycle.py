"""Start, extend and stop one test cluster: etcd, kube-apiserver, kube-controller-manager, a Coscheduling
kube-scheduler and the kwok controller, as local processes run by ``kwokctl --runtime binary``.

Role: orchestration with side effects (files in the work dir, processes, kubectl). Pure parts live in
``render``; typed inputs in ``config``; binaries in ``binaries``; the cluster's record (``Cluster``, re-exported
here) in ``record``; Kueue's manager in ``kueue`` (started by ``up`` when asked; it imports no ``lifecycle``).
Contract with the real-node scripts (issue 6): after the control plane is ready ``e2e/node/up.sh <workdir>`` runs
(when enabled and present); ``e2e/node/down.sh <workdir>`` runs before the control plane stops.

    up():   build-if-missing -> render configs -> kwokctl create -> /readyz -> PodGroup CRD (Coscheduling only)
            -> kwok nodes Ready -> default ServiceAccount -> cluster.json -> [node/up.sh]
    down(): [node/down.sh] -> kwokctl delete -> kill leftovers naming the work dir -> ports closed -> rm

``ClusterConfig.scheduler == "default"`` (``make cluster-up SCHEDULER=default``) runs the stock kube-scheduler
instead, with no PodGroup CRD: the cluster a user brings without a gang scheduler.

Invariants: everything of a cluster lives under its work dir; every process of it names the work dir in
its command line (so leftovers are found by that, never by process name); ``down`` returns only when no
such process and none of its recorded ports is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from typing import Any

from kfcluster import binaries, kube, kueue, procs, render
from kfcluster import config as cfg
from kfcluster.record import Cluster, log

NODE_SCRIPTS = binaries.E2E_DIR / "node"
PORT_NAMES = ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


def _kwok_env(*, kwok_dir: str, bin_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "KWOK_WORKDIR": kwok_dir,
        "KWOK_KUBE_VERSION": binaries.versions()["K8S_VERSION"],
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
    })
    env.pop("KUBECONFIG", None)
    return env


def _kwokctl(args: list[str], *, kwok_dir: str, bin_dir: str, log_path: pathlib.Path, timeout_s: float) -> None:
    with open(log_path, "a") as out:
        proc = subprocess.run([os.path.join(bin_dir, "kwokctl"), *args], stdout=out, stderr=subprocess.STDOUT,
                              env=_kwok_env(kwok_dir=kwok_dir, bin_dir=bin_dir), timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-20:])
        raise RuntimeError(f"kwokctl {args[0]} {args[1]} failed ({proc.returncode}); see {log_path}:\n{tail}")


def _write_kubeconfig(*, src: pathlib.Path, dst: pathlib.Path, server: str) -> None:
    """Copy kwokctl's admin kubeconfig, pointing it at ``server`` when given."""
    text = src.read_text()
    if server:
        text = re.sub(r"(server:\s*)\S+", lambda m: m.group(1) + server, text)
    tmp = dst.with_suffix(".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    tmp.replace(dst)


def healthy(workdir: str) -> Cluster | None:
    try:
        cluster = Cluster.load(workdir)
        return cluster if cluster.kubectl.readyz() else None
    except (OSError, ValueError, KeyError, RuntimeError, subprocess.TimeoutExpired):
        return None


@contextlib.contextmanager
def _locked(workdir: str) -> Iterator[None]:
    """One up/down at a time per work dir, across processes (several test sessions share a machine)."""
    lock_path = pathlib.Path(workdir).parent / f".{pathlib.Path(workdir).name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def up(config: cfg.ClusterConfig | None = None) -> Cluster:
    """Start the cluster described by ``config`` (default: ``config.from_env()``) and wait until ready.

    Idempotent: a healthy cluster already running in the same work dir is returned as is; a stale one
    is stopped first. Serialised per work dir with ``down`` (file lock next to the work dir).
    """
    config = config or cfg.from_env()
    with _locked(config.workdir):
        return _up(config)


def _up(config: cfg.ClusterConfig) -> Cluster:
    config = with_real_node_settings(config)  # every caller (fixtures too) gets the real node's settings
    t0 = time.monotonic()
    existing = healthy(config.workdir)
    if existing:
        if existing.scheduler != config.scheduler:
            raise RuntimeError(f"cluster {config.name} already runs with scheduler {existing.scheduler!r}, not "
                               f"{config.scheduler!r}: stop it first (make cluster-down) or use another KF_CLUSTER_NAME")
        log(f"cluster {config.name} already running ({existing.server})")
        return existing
    if os.path.exists(config.workdir):
        log(f"stale work dir {config.workdir}: cleaning it first")
        _down(config.workdir, timeout_s=60.0)
    bins = binaries.require(binaries.control_plane(config.scheduler))
    workdir = pathlib.Path(config.workdir)
    kwok_dir = workdir / "kwok"
    kwok_dir.mkdir(parents=True, exist_ok=True)
    ports = dict(zip(PORT_NAMES, procs.free_ports(len(PORT_NAMES)), strict=True))
    sched_path = workdir / "scheduler-config.yaml"
    sched_path.write_text(render.yaml_text(render.scheduler_config(config)))
    doc = render.kwokctl_config(config=config, bins=bins, ports=ports, scheduler_config_path=str(sched_path),
                                k8s_version=binaries.versions()["K8S_VERSION"])
    kwokctl_cfg = workdir / "kwokctl.yaml"
    kwokctl_cfg.write_text(render.kwokctl_config_text(doc, render.kwok_config(config)))
    bin_dir = str(binaries.bin_dir())
    log(f"starting control plane {config.name} in {workdir} (apiserver port {ports['kube-apiserver']})")
    _kwokctl(["create", "cluster", f"--name={config.name}", f"--config={kwokctl_cfg}", "--runtime=binary",
              f"--kubeconfig={kwok_dir / 'user-kubeconfig'}", "--wait=0s"], kwok_dir=str(kwok_dir), bin_dir=bin_dir,
             log_path=workdir / "kwokctl.log", timeout_s=config.ready_timeout_s)
    cdir = kwok_dir / "clusters" / config.name
    kubeconfig = workdir / "kubeconfig"
    _write_kubeconfig(src=cdir / "kubeconfig.yaml", dst=kubeconfig, server=config.kubeconfig_server)
    server = config.kubeconfig_server or f"https://127.0.0.1:{ports['kube-apiserver']}"
    cluster = Cluster(name=config.name, workdir=str(workdir), kubeconfig=str(kubeconfig), server=server,
                      ports=ports, bin_dir=bin_dir, kwok_dir=str(kwok_dir), real_node=config.real_node,
                      scheduler=config.scheduler)
    cluster.save()
    local = kube.Kubectl(binary=bins["kubectl"], kubeconfig=str(cdir / "kubeconfig.yaml"))
    kube.wait_for("kube-apiserver /readyz", local.readyz, timeout_s=config.ready_timeout_s)
    log(f"apiserver ready after {time.monotonic() - t0:.1f}s")
    _check_alive(cdir)
    if config.coscheduling:
        _install_podgroup_crd(local)
    cluster = add_nodes(cluster, config.nodes, timeout_s=config.ready_timeout_s)
    kube.wait_for("ServiceAccount default/default",
                  lambda: local.run("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
                  timeout_s=config.ready_timeout_s)
    _check_alive(cdir)
    log(f"control plane ready with {len(cluster.nodes)} kwok nodes in {time.monotonic() - t0:.1f}s")
    if config.kueue:
        cluster = kueue.start(cluster)
    if config.real_node:
        _node_script("up.sh", workdir=str(workdir), required=True, env={"KF_REAL_NODES": str(config.real_nodes)})
    return cluster


def _install_podgroup_crd(local: kube.Kubectl) -> None:
    local.run("apply", "--server-side", "-f", str(binaries.podgroup_crd()))
    # Polled, not `kubectl wait --for=condition=Established`: right after the apply the CRD can have no
    # status.conditions yet, and kubectl wait then fails at once ("<nil> is of the type <nil>") instead of waiting.
    kube.wait_for("PodGroup CRD Established", lambda: local.run(
        "get", "crd/podgroups.scheduling.x-k8s.io", "-o",
        "jsonpath={.status.conditions[?(@.type==\"Established\")].status}", check=False).stdout.strip() == "True",
        timeout_s=60)


def add_nodes(cluster: Cluster, pools: Iterable[cfg.NodePool], *, timeout_s: float = 60.0) -> Cluster:
    """Create the simulated nodes of ``pools`` and wait until kwok has made each Ready."""
    pools = list(pools)
    manifest = render.node_list(pools)
    names = tuple(item["metadata"]["name"] for item in manifest["items"])
    if not names:
        return cluster
    k = cluster.kubectl
    k.apply(manifest, timeout_s=max(60.0, timeout_s))     # 1,000 nodes take minutes on a loaded machine
    if len(names) <= 20:
        k.run("wait", "--for=condition=Ready", *[f"node/{n}" for n in names], f"--timeout={int(timeout_s)}s",
              timeout_s=timeout_s + 10)
    else:   # `kubectl wait` takes the nodes one by one (minutes for 1,000): one LIST per poll instead
        want = set(names)
        kube.wait_for(f"{len(names)} nodes Ready", lambda: want <= _ready_nodes(k), timeout_s=timeout_s,
                      interval_s=2.0)
    updated = dataclasses.replace(cluster, nodes=tuple(dict.fromkeys(cluster.nodes + names)))
    updated.save()
    shown = ", ".join(names) if len(names) <= 10 else f"{', '.join(names[:5])}, ... {names[-1]} ({len(names)})"
    log(f"nodes Ready: {shown}")
    return updated


def _ready_nodes(k: kube.Kubectl) -> set[str]:
    out = k.run("get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name} "
                "{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}", check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.endswith(" True")}


def dead_components(cluster_dir: pathlib.Path) -> dict[str, str]:
    """component -> last lines of its log, for every component whose pid file names a dead process."""
    dead = {}
    live = procs.processes_mentioning(str(cluster_dir))
    for pid_file in sorted(cluster_dir.joinpath("pids").glob("*.pid")):
        component = pid_file.stem
        text = pid_file.read_text().strip()
        if not (text.isdigit() and int(text) in live):
            log_file = cluster_dir / "logs" / f"{component}.log"
            tail = log_file.read_text(errors="replace").splitlines()[-5:] if log_file.is_file() else []
            dead[component] = "\n".join(tail)
    return dead


def _check_alive(cluster_dir: pathlib.Path) -> None:
    dead = dead_components(cluster_dir)
    if dead:
        details = "\n".join(f"--- {c} (logs/{c}.log):\n{tail}" for c, tail in dead.items())
        raise RuntimeError(f"control-plane component(s) exited: {', '.join(dead)}\n{details}")


def with_real_node_settings(config: cfg.ClusterConfig) -> cfg.ClusterConfig:
    """``config`` plus the control-plane settings the real node needs (from e2e/node/realnode.py's
    ``cluster_overrides``, owned by the real-node scripts), when ``config.real_node`` is on.
    Flags the caller set explicitly win."""
    path = NODE_SCRIPTS / "realnode.py"
    if not config.real_node or not path.is_file():
        return config
    spec = importlib.util.spec_from_file_location("kubeforge_e2e_realnode", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    over: dict[str, Any] = dict(module.cluster_overrides(workdir=config.workdir, name=config.name))
    for key in ("extra_apiserver_args", "extra_kwok_args", "extra_scheduler_args"):
        if key in over:
            over[key] = {**over[key], **getattr(config, key)}
    return dataclasses.replace(config, **over)


def _node_script(script: str, *, workdir: str, required: bool, env: dict[str, str] | None = None) -> None:
    path = NODE_SCRIPTS / script
    if not path.is_file():
        msg = f"real node requested but {path} does not exist"
        if required:
            raise FileNotFoundError(msg)
        log(msg + " (skipped)")
        return
    log(f"running {path} {workdir}")
    subprocess.run(["bash", str(path), workdir], check=True, env={**os.environ, **(env or {})})


def _stop_kueue(kwok_dir: str) -> None:
    """Kueue's manager first (``kfcluster.kueue``): it is no kwokctl component, and stopped before the API server
    it would otherwise keep retrying."""
    pid_file = pathlib.Path(kwok_dir, "kueue", "kueue.pid")
    text = pid_file.read_text().strip() if pid_file.is_file() else ""
    if text.isdigit() and int(text) in procs.processes_mentioning(kwok_dir):
        procs.terminate([int(text)])


def _leftovers(workdir: str) -> dict[int, str]:
    return procs.processes_mentioning(os.path.join(workdir, "kwok"))


def down(*, workdir: str | None = None, config: cfg.ClusterConfig | None = None, timeout_s: float = 60.0) -> None:
    """Stop the cluster in ``workdir`` (or ``config``'s) and remove its work dir.

    Returns only when no process naming the work dir is alive and none of its ports listens.
    """
    workdir = workdir or (config or cfg.from_env()).workdir
    with _locked(workdir):
        _down(workdir, timeout_s=timeout_s)


def _down(workdir: str, *, timeout_s: float) -> None:
    if not os.path.isdir(workdir):
        log(f"no cluster at {workdir}")
        return
    try:
        cluster: Cluster | None = Cluster.load(workdir)
    except (OSError, ValueError, TypeError):
        cluster = None
    # The cluster's own record decides; the environment only when there is no record. (A session run with
    # KUBEFORGE_REAL_NODE=1 also stops kwok-only clusters, e.g. the up/down cycle test's: their down must not run
    # the node's down.sh, which would refuse to touch the session's real node and fail.)
    real = cluster.real_node if cluster else os.environ.get("KUBEFORGE_REAL_NODE", "") in ("1", "true")
    node_error: subprocess.CalledProcessError | None = None
    if real:
        try:
            _node_script("down.sh", workdir=workdir, required=False)
        except subprocess.CalledProcessError as exc:  # still stop the control plane, then report the failure
            log(f"real node down failed ({exc}); stopping the control plane anyway")
            node_error = exc
    kwok_dir = os.path.join(workdir, "kwok")
    _stop_kueue(kwok_dir)
    bin_dir = cluster.bin_dir if cluster else str(binaries.bin_dir())
    name = cluster.name if cluster else os.path.basename(workdir.rstrip("/"))
    if os.path.isdir(os.path.join(kwok_dir, "clusters", name)):
        try:
            # --kubeconfig: a scratch file (kwokctl's default edits ~/.kube/config; an empty value fails).
            _kwokctl(["delete", "cluster", f"--name={name}", f"--kubeconfig={kwok_dir}/user-kubeconfig"],
                     kwok_dir=kwok_dir, bin_dir=bin_dir, log_path=pathlib.Path(workdir, "kwokctl.log"), timeout_s=timeout_s)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            log(f"kwokctl delete failed, stopping processes directly: {exc}")
    left = _leftovers(workdir)
    if left:
        log(f"terminating {len(left)} leftover process(es): {sorted(left)}")
        procs.terminate(sorted(left))
    ports = set(cluster.ports.values()) if cluster else set()
    kube.wait_for(f"no process naming {kwok_dir} and ports {sorted(ports)} closed",
                  lambda: not _leftovers(workdir) and not (ports & procs.listening_ports()),
                  timeout_s=timeout_s)
    shutil.rmtree(workdir, ignore_errors=True)
    log(f"cluster {name} stopped; {workdir} removed")
    if node_error is not None:
        raise node_error


def cluster_rss_kib(cluster: Cluster) -> dict[str, Any]:
    """RSS per cluster process (KiB), keyed by the program name, for measurements."""
    out: dict[str, Any] = {}
    for pid, cmd in _leftovers(cluster.workdir).items():
        prog = os.path.basename(cmd.split(" ", 1)[0])
        out[f"{prog}[{pid}]"] = procs.rss_kib(pid)
    out["total"] = sum(v for v in out.values())
    return out
