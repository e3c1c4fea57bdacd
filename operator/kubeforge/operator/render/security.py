"""Pod security of the role pods: what the ``restricted`` Pod Security Standard demands, and the writable paths a
read-only root filesystem then needs.

Role: the security fragments of a role's pod spec and container. Invariants:
- every pod runs as a non-root UID (``RUNTIME_UID``, the runtime image's user) with seccomp ``RuntimeDefault``;
  every container drops ALL capabilities, cannot escalate privileges and has a read-only root filesystem;
- writable places are ``emptyDir``s: ``/tmp`` (also ``HOME`` unless the role sets its own, so caches of the model
  build, vLLM and torch land there);
- the ServiceAccount token is mounted only in pods of roles that talk to the API server (the trainer: rank 0
  patches its pod's progress annotation; a StatefulSet has one template, so every trainer replica gets it).
"""
from __future__ import annotations

from kubeforge.operator.render import meta

#: The runtime image's user (images/runtime): UID and GID 1000.
RUNTIME_UID = 1000
TMP_VOLUME = "kubeforge-tmp"
TMP_DIR = "/tmp"
#: Roles whose pods get a ServiceAccount token.
API_ROLES = frozenset({"trainer"})


def pod_security_context() -> meta.Obj:
    """The pod-level ``securityContext`` (fsGroup makes emptyDirs and claimed volumes writable by the UID)."""
    return {"runAsNonRoot": True, "runAsUser": RUNTIME_UID, "runAsGroup": RUNTIME_UID, "fsGroup": RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context() -> meta.Obj:
    """The container-level ``securityContext``."""
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def automount_token(role: str) -> bool:
    """Whether ``role``'s pods get the ServiceAccount token."""
    return role in API_ROLES


def writable_volumes() -> list[meta.Obj]:
    """The ``emptyDir`` volumes every role pod has."""
    return [{"name": TMP_VOLUME, "emptyDir": {}}]


def writable_mounts() -> list[meta.Obj]:
    return [{"name": TMP_VOLUME, "mountPath": TMP_DIR}]


def default_env() -> list[meta.Obj]:
    """Env a role's own ``env`` may override: ``HOME`` on the writable ``/tmp``."""
    return [{"name": "HOME", "value": TMP_DIR}]
