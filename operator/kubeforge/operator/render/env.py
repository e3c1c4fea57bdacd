"""The env contract of a role's container (``kubeforge.api.contract``), as Kubernetes env entries.

Role: tells each process who it is (role, index, attempt), who its peers are (stable DNS names behind the
job's headless Service, all at ``contract.DEFAULT_PORT_BASE``) and how big each role is. The same variables the local
launcher sets for a plain process. Invariant: peers and world sizes come from the spec alone, so every pod of an
attempt sees the same world (a replica change starts a new attempt; see ``lifecycle``).
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta


def _field(path: str) -> meta.Obj:
    return {"fieldRef": {"fieldPath": path}}


def peers(job: rljob.RLJob, role: str, namespace: str) -> str:
    """``host:portBase`` of every replica of ``role`` by index, comma-separated."""
    n = getattr(job.spec.roles, role).replicas
    return ",".join(f"{names.peer_host(job.metadata.name, role, i, namespace)}:{contract.DEFAULT_PORT_BASE}"
                    for i in range(n))


def role_env(job: rljob.RLJob, ctx: context.RenderContext, *, role: str) -> list[meta.Obj]:
    """Env entries of ``role``'s container: the contract first, then the role's own ``env``."""
    fixed: list[meta.Obj] = [
        {"name": contract.ENV_ROLE, "value": role},
        {"name": contract.ENV_INDEX, "valueFrom": _field(f"metadata.labels['{names.LABEL_POD_INDEX}']")},
        {"name": contract.ENV_CONFIG, "value": names.CONFIG_PATH},
        {"name": contract.ENV_JOB_NAME, "value": job.metadata.name},
        {"name": contract.ENV_NAMESPACE, "valueFrom": _field("metadata.namespace")},
        {"name": contract.ENV_POD_NAME, "valueFrom": _field("metadata.name")},
        {"name": contract.ENV_PORT_BASE, "value": str(contract.DEFAULT_PORT_BASE)},
        {"name": contract.ENV_BIND_HOST, "value": "0.0.0.0"},
        {"name": contract.ENV_ATTEMPT, "value": str(ctx.attempt)},
        {"name": contract.ENV_REPORT, "value": "pod-annotation"},
        {"name": contract.ENV_JOB_KEY, "valueFrom": {"secretKeyRef": {
            "name": contract.job_key_secret(job.metadata.name), "key": contract.JOB_KEY_SECRET_KEY}}},
    ]
    for other in contract.ROLES:
        fixed.append({"name": contract.env_replicas(other), "value": str(getattr(job.spec.roles, other).replicas)})
        fixed.append({"name": contract.env_peers(other), "value": peers(job, other, ctx.namespace)})
    taken = {e["name"] for e in fixed}
    extra = [{"name": e.name, "value": e.value} for e in getattr(job.spec.roles, role).env if e.name not in taken]
    return fixed + extra
