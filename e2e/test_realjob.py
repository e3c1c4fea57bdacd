"""Unit tests of the real-pod manifest builder (``e2e/realjob.py``): no cluster needed."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

import realjob
from kubeforge.api import load
from node import realnode


def _job(tmp: pathlib.Path) -> dict:  # type: ignore[type-arg]
    return realjob.manifest(name="tiny", namespace="ns", checkpoint_dir=tmp / "ck")


def test_manifest_is_a_valid_rljob_with_every_role_on_the_real_node(tmp_path: pathlib.Path) -> None:
    doc = _job(tmp_path)
    job = load.parse(doc)                                   # the API's own validation
    assert job.metadata.name == "tiny" and doc["metadata"]["namespace"] == "ns"
    assert job.spec.algorithm.steps == realjob.load_tiny()["spec"]["algorithm"]["steps"]
    for role in realjob.ROLES:
        spec = getattr(job.spec.roles, role)
        assert spec.node_selector == {realnode.NODE_LABEL: "true"}
        assert spec.image == realnode.BASE_IMAGE
        assert spec.tolerations == [realnode.REAL_NODE_TOLERATION]  # the real node's taint only: kwok's stays
        assert not any("gpu" in k for k in spec.resources.limits)
        assert spec.command[:2] == ["/bin/sh", "-c"] and spec.command[3] == realnode.venv_python_parts().python
        assert all(v["hostPath"]["path"] for v in spec.volumes)
    assert job.spec.roles.generator.enforce_eager
    assert job.spec.checkpoint.path == realjob.CONTAINER_CHECKPOINTS
    trainer_vols = {v["name"]: v for v in job.spec.roles.trainer.volumes}
    assert trainer_vols[realjob.CHECKPOINT_VOLUME]["hostPath"]["path"] == str(tmp_path / "ck")


def test_image_parts_run_every_role_from_the_runtime_image_with_no_host_mount(tmp_path: pathlib.Path) -> None:
    image = "kubeforge.local/runtime:0.1.0-cpu"
    base = realjob.load_tiny(realjob.ROOT / "examples" / "tiny-verifiers.yaml")
    job = load.parse(realjob.manifest(name="v", namespace="ns", checkpoint_dir=tmp_path / "ck", base=base,
                                      parts=realjob.image_parts(image)))
    for role in realjob.ROLES:
        spec = getattr(job.spec.roles, role)
        assert spec.image == image and spec.command[3] == realjob.IMAGE_PYTHON
        mounted = {v["hostPath"]["path"] for v in spec.volumes}
        assert mounted == ({str(tmp_path / "ck")} if role == "trainer" else set())   # checkpoints only


def test_manifest_does_not_mutate_its_input_and_rejects_relative_dirs(tmp_path: pathlib.Path) -> None:
    base = realjob.load_tiny()
    before = repr(base)
    realjob.manifest(name="x", namespace="ns", checkpoint_dir=tmp_path, base=base, steps=3)
    assert repr(base) == before
    with pytest.raises(ValueError, match="absolute"):
        realjob.manifest(name="x", namespace="ns", checkpoint_dir=pathlib.Path("rel"))


@pytest.mark.parametrize("signal_number, code", [(10, 138), (15, 143)])
def test_wrapper_exits_with_the_role_processes_status(tmp_path: pathlib.Path, signal_number: int,
                                                      code: int) -> None:
    """The container's PID 1: the role runs as its child, killed with signal N it exits 128 + N."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"$@\" > \"$ARGS\"\nexec sleep 30\n")
    fake.chmod(0o755)
    pidfile = pathlib.Path(realjob.ROLE_PID_FILE)
    pidfile.unlink(missing_ok=True)
    proc = subprocess.Popen(["sh", "-c", realjob.WRAPPER, str(fake), "role", "trainer"],
                            env={"ARGS": str(tmp_path / "args"), "PATH": "/usr/bin:/bin"})
    for _ in range(100):
        if pidfile.exists() and pidfile.read_text().strip() and (tmp_path / "args").exists():
            break
        subprocess.run(["sleep", "0.05"], check=True)
    child = int(pidfile.read_text())
    subprocess.run(["kill", f"-{signal_number}", str(child)], check=True)
    assert proc.wait(10) == code
    pidfile.unlink(missing_ok=True)
    assert (tmp_path / "args").read_text().split() == ["-m", "kubeforge.cli", "role", "trainer"]
