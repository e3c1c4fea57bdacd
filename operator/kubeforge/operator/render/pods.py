"""Container parts every kubeforge pod shares, a role's or a GeneratorPool engine's: resource requirements as
Kubernetes writes them, and the memory-backed ``/dev/shm`` a pod needs when it talks NCCL or runs vLLM tensor
parallelism (the container runtime's default 64 MiB makes NCCL and vLLM's shared-memory broadcast fail).

Neighbours: ``render.statefulset`` (the roles' pods) and ``render.pool`` (the pool's engines).
"""
from __future__ import annotations

from collections.abc import Sequence

from kubeforge.api import rljob
from kubeforge.operator import names
from kubeforge.operator.render import meta, security

SHM_VOLUME = "dshm"
SHM_GIB_PER_DEVICE = 2


def resources(req: rljob.ResourceRequirements) -> meta.Obj:
    """``limits``/``requests`` as string quantities, keys sorted; empty parts left out."""
    out: meta.Obj = {}
    if req.limits:
        out["limits"] = {k: str(v) for k, v in sorted(req.limits.items())}
    if req.requests:
        out["requests"] = {k: str(v) for k, v in sorted(req.requests.items())}
    return out


def shm_gib(pods: rljob.PodSettings, *, tensor_parallel: int = 1) -> int:
    """GiB of ``/dev/shm`` the pods need: 0 when they use neither GPUs nor vLLM tensor parallelism."""
    gpus = rljob.gpu_count(pods.resources)
    if gpus == 0 and tensor_parallel <= 1:
        return 0
    return SHM_GIB_PER_DEVICE * max(gpus, tensor_parallel)


def shm_volume(gib: int) -> meta.Obj:
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{gib}Gi"}}


SHM_MOUNT: meta.Obj = {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def container_fields(spec: rljob.PodSettings) -> meta.Obj:
    """A container's mounts (the config, the writable ``/tmp``, the pods' own), restricted security context and
    resources (when set)."""
    out: meta.Obj = {
        "volumeMounts": [{"name": names.CONFIG_VOLUME, "mountPath": names.CONFIG_DIR, "readOnly": True},
                         *security.writable_mounts(), *[dict(m) for m in spec.volume_mounts]],
        "securityContext": security.container_security_context(),
    }
    res = resources(spec.resources)
    if res:
        out["resources"] = res
    return out


def scheduling(spec: rljob.PodSettings, *, default_pull: Sequence[str]) -> meta.Obj:
    """The pod spec's node selector, tolerations, priority class and pull secrets (the pods' own list of pull
    secrets wins over ``default_pull``, the operator's), only those that are set."""
    out: meta.Obj = {}
    if spec.node_selector:
        out["nodeSelector"] = dict(sorted(spec.node_selector.items()))
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    if spec.priority_class_name:
        out["priorityClassName"] = spec.priority_class_name
    pull = [s.name for s in spec.image_pull_secrets] or list(default_pull)
    if pull:
        out["imagePullSecrets"] = [{"name": n} for n in pull]
    return out
