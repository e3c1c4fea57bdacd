"""Pods that talk NCCL or run vLLM tensor parallelism get a sized, memory-backed /dev/shm; others do not."""
from __future__ import annotations

import opbuilders
from kubeforge.operator import render
from kubeforge.operator.render import context, statefulset

CTX = context.RenderContext(namespace="ns", uid="u")


def _pod(out: render.Rendered, role: str) -> dict:
    sts = [o for o in out.desired if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(role)]
    return sts[0]["spec"]["template"]["spec"]


def _shm(pod: dict) -> tuple[list[dict], list[dict]]:
    vols = [v for v in pod["volumes"] if v["name"] == statefulset.SHM_VOLUME]
    mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    return vols, mounts


def test_gpu_trainers_and_tensor_parallel_generators_get_dev_shm() -> None:
    job = opbuilders.job("tiny", spec__roles__trainer={"replicas": 2, "resources": {"limits": {"nvidia.com/gpu": 4}}},
                         spec__roles__generator={"tensorParallelSize": 2})
    out = render.render(job, CTX)
    for role, gib in (("trainer", 8), ("generator", 4)):
        vols, mounts = _shm(_pod(out, role))
        assert vols == [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{gib}Gi"}}]
        assert mounts == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert _shm(_pod(out, "verifier")) == ([], [])


def test_cpu_pods_keep_the_default_shm() -> None:
    out = render.render(opbuilders.job("tiny"), CTX)
    for role in ("trainer", "generator", "verifier"):
        assert _shm(_pod(out, role)) == ([], [])
