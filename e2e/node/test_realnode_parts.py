"""Unit tests of the real node's pure helpers (no cluster): pod parts, node status, cluster overrides,
and the image packer (buildah). The cluster-level behaviour is e2e/test_realnode_smoke.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import realnode  # noqa: E402

IMAGES_LIB = pathlib.Path(__file__).resolve().parents[2] / "images" / "lib"


def _fake_install(tmp_path: pathlib.Path, *, venv_inside_repo: bool) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    prefix = tmp_path / "pyprefix"
    (prefix / "bin").mkdir(parents=True)
    repo = tmp_path / "repo"
    repo.mkdir()
    venv = (repo / ".venv") if venv_inside_repo else (tmp_path / "venv")
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text(f"home = {prefix}/bin\ninclude-system-site-packages = false\n")
    return prefix, repo, venv


@pytest.mark.parametrize("inside", [True, False])
def test_venv_parts_mount_prefix_repo_and_libs_read_only(tmp_path: pathlib.Path, inside: bool) -> None:
    prefix, repo, venv = _fake_install(tmp_path, venv_inside_repo=inside)
    parts = realnode.venv_python_parts(venv=venv, repo=repo, multiarch="x86_64-linux-gnu")
    pairs = {(v["hostPath"]["path"], m["mountPath"]) for v, m in zip(parts.volumes, parts.volume_mounts, strict=True)}
    expected = {(str(prefix), str(prefix)), (str(repo), str(repo)),
                ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"), ("/usr/lib64", "/lib64")}
    if not inside:
        expected.add((str(venv), str(venv)))
    assert pairs == expected
    assert all(m["readOnly"] for m in parts.volume_mounts)
    assert [v["name"] for v in parts.volumes] == [m["name"] for m in parts.volume_mounts]
    assert len({v["name"] for v in parts.volumes}) == len(parts.volumes)
    assert parts.python == f"{venv}/bin/python"
    assert dict((e["name"], e["value"]) for e in parts.env)["PATH"].startswith(f"{venv}/bin:")
    assert parts.image == realnode.BASE_IMAGE


def test_venv_parts_reject_a_venv_without_home(tmp_path: pathlib.Path) -> None:
    _, repo, venv = _fake_install(tmp_path, venv_inside_repo=True)
    (venv / "pyvenv.cfg").write_text("version = 3.11\n")
    with pytest.raises(ValueError, match="home"):
        realnode.venv_python_parts(venv=venv, repo=repo)


def _node(**over: Any) -> dict[str, Any]:
    node: dict[str, Any] = {
        "metadata": {"name": realnode.NODE_NAME, "labels": {realnode.NODE_LABEL: "true"}},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    for key, value in over.items():
        node[key] = {**node[key], **value}
    return node


@pytest.mark.parametrize(("node", "up", "fragment"), [
    (None, False, "does not exist"),
    (_node(), True, "Ready"),
    (_node(metadata={"labels": {}}), False, "lacks label"),
    (_node(spec={"taints": [{"key": realnode.KWOK_TAINT_KEY, "effect": "NoSchedule"}]}), False, "kwok taint"),
    (_node(spec={"unschedulable": True}), False, "cordoned"),
    (_node(status={"conditions": [{"type": "Ready", "status": "False", "message": "PLEG"}]}), False, "PLEG"),
    (_node(status={"conditions": []}), False, "no condition"),
])
def test_node_status_from(node: dict[str, Any] | None, up: bool, fragment: str) -> None:
    got = realnode.node_status_from(node)
    assert got.up is up
    assert fragment in got.reason


class _FailingKubectl:
    def get_json(self, *args: str) -> Any:
        raise RuntimeError("connection refused")


def test_status_reports_an_unreachable_cluster() -> None:
    got = realnode.status(_FailingKubectl())
    assert not got.up and "connection refused" in got.reason


def test_cluster_overrides_point_pods_at_the_bridge() -> None:
    o = realnode.cluster_overrides(workdir="/w/c", name="c")
    args = o["extra_apiserver_args"]
    assert args["advertise-address"] == realnode.NODE_IP
    assert realnode.NODE_IP in o["apiserver_cert_sans"] and realnode.SERVICE_IP in o["apiserver_cert_sans"]
    assert args["kubelet-client-certificate"] == "/w/c/kwok/clusters/c/pki/admin.crt"
    assert args["service-cluster-ip-range"] == realnode.SERVICE_CIDR


def test_on_real_node_adds_selector_without_mutating() -> None:
    spec = {"nodeSelector": {"a": "b"}, "containers": []}
    out = realnode.on_real_node(spec)
    assert out["nodeSelector"] == {"a": "b", realnode.NODE_LABEL: "true"}
    assert out["tolerations"] == [realnode.REAL_NODE_TOLERATION]
    assert spec["nodeSelector"] == {"a": "b"} and "tolerations" not in spec


@pytest.mark.skipif(not shutil.which("buildah") or os.geteuid() != 0, reason="buildah as root (make host-deps)")
def test_packed_images_are_reproducible_oci_archives(tmp_path: pathlib.Path) -> None:
    """kf_pack_rootfs (buildah) packs a directory as one layer: root-owned, symlinks and modes kept, timestamps 0,
    so the same directory gives the same image digest; the archive names the ref containerd imports."""
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_text("#!/bin/sh\necho hi\n")
    (root / "bin" / "hello").chmod(0o755)
    (root / "bin" / "hi").symlink_to("hello")
    script = (f'source {IMAGES_LIB}/buildah.sh; source {IMAGES_LIB}/pack.sh; for o in a b; do kf_pack_rootfs {root} kubeforge.local/test:1 {tmp_path}/$o.tar '
              '--cmd \'["/bin/hello"]\'; done')
    subprocess.run(["bash", "-c", script], check=True, timeout=120, capture_output=True,
                   env={**os.environ, "KF_REPO_ROOT": str(IMAGES_LIB.parents[1]),   # a private storage
                        "KF_BUILDAH_ROOT": str(tmp_path / "storage"), "KF_BUILDAH_RUNROOT": str(tmp_path / "run"),
                        "KF_BUILDAH_DRIVER": "vfs"})
    indexes = []
    for name in ("a", "b"):
        with tarfile.open(tmp_path / f"{name}.tar") as tar:
            def blob(digest: str, tar: tarfile.TarFile = tar) -> bytes:
                return tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}").read()  # type: ignore[union-attr]
            index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
            indexes.append(index)
            (entry,) = index["manifests"]
            manifest = json.loads(blob(entry["digest"]))
            config = json.loads(blob(manifest["config"]["digest"]))
            (layer,) = manifest["layers"]
            data = blob(layer["digest"])
    assert indexes[0] == indexes[1], "the same directory gives the same image"
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "kubeforge.local/test:1"
    assert config["config"]["Cmd"] == ["/bin/hello"] and config["os"] == "linux"
    assert hashlib.sha256(data).hexdigest() == layer["digest"].removeprefix("sha256:")
    with tarfile.open(fileobj=io.BytesIO(data)) as inner:
        members = {m.name.removeprefix("./"): m for m in inner.getmembers()}
    assert members["bin/hi"].issym() and members["bin/hi"].linkname == "hello"
    assert members["bin/hello"].mode & 0o111 and members["bin/hello"].mtime == 0 and members["bin/hello"].uid == 0


def test_kubelet_never_collects_images_and_evicts_only_when_out_of_space(tmp_path: pathlib.Path) -> None:
    """Every image on the real node was imported from an archive and none can be pulled back: the kubelet's image
    garbage collection, triggered by a nearly full disk, deleted the pause image and every pod stayed in
    ContainerCreating (CI, session 4). Its eviction floors are absolute, so a big disk with little free does not
    read as 'short of space'."""
    import yaml

    node = tmp_path / "n"
    (node / "etc").mkdir(parents=True)
    env = {**os.environ, "KF_N": str(node), "KF_NODE_IP": "10.0.0.1", "KF_KUBELET_PORT": "10250",
           "KF_CONTAINERD_SOCK": "/x.sock", "KF_CA_CRT": "/ca.crt"}
    script = pathlib.Path(__file__).resolve().parent / "configs.sh"
    subprocess.run(["bash", "-c", f"set -eu; source {script}; render_kubelet"], env=env, check=True, timeout=30)
    config = yaml.safe_load((node / "etc" / "kubelet.yaml").read_text())
    assert config["imageGCHighThresholdPercent"] == 100  # 100 turns image garbage collection off
    assert config["imageGCLowThresholdPercent"] < 100
    for signal in ("nodefs.available", "imagefs.available"):
        floor = config["evictionHard"][signal]
        assert not floor.endswith("%") and floor.endswith("Mi") and int(floor[:-2]) <= 1024, (signal, floor)


def test_more_nodes_names_ranges_and_pinning() -> None:
    assert [realnode.node_name(i) for i in range(2)] == ["kf-real-0", "kf-real-1"]
    assert realnode.node_pod_prefix(1) == "10.89."
    with pytest.raises(ValueError):
        realnode.node_name(realnode.MAX_REAL_NODES)
    out = realnode.on_real_node({"containers": []}, node="kf-real-1")
    assert out["nodeSelector"] == {realnode.NODE_LABEL: "true", realnode.HOSTNAME_LABEL: "kf-real-1"}


def test_cannot_host_nodes_names_the_reason(tmp_path: pathlib.Path) -> None:
    proc = tmp_path / "proc"
    (proc / "self" / "ns").mkdir(parents=True)
    (proc / "self" / "ns" / "net").write_text("")
    (proc / "meminfo").write_text("MemAvailable:    8000000 kB\n")
    assert realnode.cannot_host_nodes(1, euid=1000) is None  # one node: nothing extra needed
    assert "root" in (realnode.cannot_host_nodes(2, proc=proc, cgroup=tmp_path, euid=1000) or "")
    assert "at most" in (realnode.cannot_host_nodes(9, euid=0) or "")
    if shutil.which("nsenter") and shutil.which("ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"):
        assert realnode.cannot_host_nodes(2, proc=proc, cgroup=tmp_path, euid=0) is None
        (proc / "meminfo").write_text("MemAvailable:    500000 kB\n")
        assert "memory" in (realnode.cannot_host_nodes(2, proc=proc, cgroup=tmp_path, euid=0) or "")
        (proc / "self" / "ns" / "net").unlink()
        assert "namespaces" in (realnode.cannot_host_nodes(2, proc=proc, cgroup=tmp_path, euid=0) or "")


def test_cluster_config_real_nodes_from_env_and_bounds() -> None:
    from kfcluster import config as cfg

    assert cfg.from_env({"KF_REAL_NODES": "2"}).real_nodes == 2
    assert cfg.from_env({}).real_nodes == 1
    with pytest.raises(ValueError, match="real_nodes"):
        cfg.from_env({"KF_REAL_NODES": "5"})


@pytest.mark.parametrize(("text", "seconds"), [("40s", 40.0), ("3m20s", 200.0), ("1h0m0s", 3600.0), ("500ms", 0.5),
                                               ("5s", 5.0)])
def test_go_duration(text: str, seconds: float) -> None:
    assert realnode.go_duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "40", "forty", "3m20"])
def test_go_duration_refuses_other_text(text: str) -> None:
    with pytest.raises(ValueError):
        realnode.go_duration_s(text)


def _proc(tmp_path: pathlib.Path, pid: int, *args: str) -> None:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cmdline").write_bytes("\0".join(args).encode() + b"\0")


def test_node_monitor_reads_the_clusters_controller_manager(tmp_path: pathlib.Path) -> None:
    _proc(tmp_path, 10, "/bin/kube-controller-manager", "--kubeconfig=/tmp/mine-2/kubeconfig",
          "--node-monitor-grace-period=1h0m0s")
    _proc(tmp_path, 11, "/bin/kube-apiserver", "--etcd-servers=http://x", "--cert-dir=/tmp/mine/pki")
    _proc(tmp_path, 12, "/bin/kube-controller-manager", "--kubeconfig=/tmp/mine/kubeconfig",
          "--node-monitor-grace-period=3m20s", "--node-monitor-period=10s")
    assert realnode.node_monitor("/tmp/mine", proc=tmp_path) == {"node-monitor-grace-period": 200.0,
                                                                 "node-monitor-period": 10.0}


def test_node_monitor_defaults_for_flags_not_set_and_no_process(tmp_path: pathlib.Path) -> None:
    _proc(tmp_path, 12, "/bin/kube-controller-manager", "--kubeconfig=/tmp/mine/kubeconfig",
          "--node-monitor-grace-period=40s")
    assert realnode.node_monitor("/tmp/mine", proc=tmp_path) == {"node-monitor-grace-period": 40.0,
                                                                 "node-monitor-period": 5.0}
    assert realnode.node_monitor("/tmp/none", proc=tmp_path) == realnode.NODE_MONITOR_DEFAULTS


def _holder(lock: pathlib.Path) -> subprocess.Popen[str]:
    """Another process that holds ``lock`` until its stdin closes (it prints once it holds it)."""
    code = ("import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); "
            "sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_the_real_node_lock_waits_a_bounded_time_and_names_its_holder(tmp_path: pathlib.Path) -> None:
    import fcntl

    lock = tmp_path / "realnode.lock"
    holder = _holder(lock)
    said: list[str] = []
    try:
        with pytest.raises(SystemExit) as exc, realnode.real_node_lock(wait_s=0.5, path=lock, poll_s=0.1,
                                                                       say=said.append):
            pass
        assert f"pid {holder.pid}" in str(exc.value) and "KF_REAL_NODE_WAIT_S" in str(exc.value)
        assert len(said) == 1 and str(lock) in said[0]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    # free now: taken at once, held while the block runs, released after it
    with realnode.real_node_lock(wait_s=0.0, path=lock):
        with open(lock) as other:
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_the_real_node_lock_is_ours_under_flock(tmp_path: pathlib.Path) -> None:
    """Run as `flock LOCK python ...` (the descriptor inherited): no wait for its own lock."""
    if not shutil.which("flock"):
        pytest.skip("no flock(1) on this machine")
    lock = tmp_path / "realnode.lock"
    code = ("import pathlib, sys; sys.path.insert(0, sys.argv[2]); import realnode; "
            "exec('with realnode.real_node_lock(wait_s=0.0, path=pathlib.Path(sys.argv[1])): print(\"inside\")')")
    res = subprocess.run(["flock", str(lock), sys.executable, "-c", code, str(lock),
                          str(pathlib.Path(realnode.__file__).parent)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "inside"
