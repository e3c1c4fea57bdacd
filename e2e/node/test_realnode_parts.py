"""Unit tests of the real node's pure helpers (no cluster): pod parts, node status, cluster overrides,
and the docker-save image packer. The cluster-level behaviour is e2e/test_realnode_smoke.py."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import pathlib
import sys
import tarfile
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import realnode  # noqa: E402

IMAGES_LIB = pathlib.Path(__file__).resolve().parents[2] / "images" / "lib" / "dockersave.py"


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


def _dockersave() -> Any:
    spec = importlib.util.spec_from_file_location("dockersave", IMAGES_LIB)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["dockersave"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_dockersave_is_reproducible_and_well_formed(tmp_path: pathlib.Path) -> None:
    ds = _dockersave()
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "hello").write_text("#!/bin/sh\necho hi\n")
    (root / "bin" / "hello").chmod(0o755)
    (root / "bin" / "hi").symlink_to("hello")
    spec = ds.ImageSpec(ref="kubeforge.local/test:1", cmd=["/bin/hello"])
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    id_a = ds.write_image(rootfs=root, spec=spec, out=a)
    id_b = ds.write_image(rootfs=root, spec=spec, out=b)
    assert id_a == id_b and a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        assert manifest[0]["RepoTags"] == ["kubeforge.local/test:1"]
        config = json.load(tar.extractfile(manifest[0]["Config"]))  # type: ignore[arg-type]
        layer = tar.extractfile(manifest[0]["Layers"][0]).read()  # type: ignore[union-attr]
    assert config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(layer).hexdigest()}"]
    assert id_a == "sha256:" + manifest[0]["Config"].removesuffix(".json")
    assert config["config"]["Cmd"] == ["/bin/hello"]
    with tarfile.open(fileobj=__import__("io").BytesIO(layer)) as inner:
        members = {m.name: m for m in inner.getmembers()}
    assert members["bin/hi"].issym() and members["bin/hi"].linkname == "hello"
    assert members["bin/hello"].mode & 0o111 and members["bin/hello"].mtime == 0
