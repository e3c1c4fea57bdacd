"""Per-job least-privilege identity: a ServiceAccount whose Role may only get and patch the job's own pods.

Why: trainer rank 0 reports progress by patching ``contract.ANNOTATION_PROGRESS`` on its own pod. Invariant: the
Role names every pod of the job by name (``resourceNames``) and grants nothing else; it follows replica changes.
"""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta


def pod_names(job: rljob.RLJob) -> list[str]:
    """Every pod name the job can have at its current replica counts."""
    out = []
    for role in job.spec.own_roles():
        replicas = getattr(job.spec.roles, role).replicas
        out += [names.pod(job.metadata.name, role, i) for i in range(replicas)]
    return out


def service_account(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": meta.metadata(job, ctx, name=names.service_account(job.metadata.name))}


def role(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": meta.metadata(job, ctx, name=names.service_account(job.metadata.name)),
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"],
                   "resourceNames": pod_names(job)}],
    }


def role_binding(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    name = names.service_account(job.metadata.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": meta.metadata(job, ctx, name=name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
    }


def objects(job: rljob.RLJob, ctx: context.RenderContext) -> list[meta.Obj]:
    """ServiceAccount, Role, RoleBinding."""
    return [service_account(job, ctx), role(job, ctx), role_binding(job, ctx)]
