"""Object metadata shared by every child: labels, owner reference, identity keys.

Role: the one place that decides how a child is labelled and owned. Invariant: every child carries
``contract.LABEL_JOB`` (so label-selected watches route its events to the job) and a controller owner reference
to the RLJob (so deleting the RLJob garbage-collects it).
"""
from __future__ import annotations

from typing import Any

from kubeforge.api import contract, rljob
from kubeforge.operator.render import context

Obj = dict[str, Any]


def job_labels(job: rljob.RLJob) -> dict[str, str]:
    """Labels every child of ``job`` carries."""
    return {contract.LABEL_JOB: job.metadata.name, contract.LABEL_MANAGED_BY: contract.MANAGED_BY}


def role_labels(job: rljob.RLJob, role: str) -> dict[str, str]:
    """Labels selecting the pods of one role (stable: used in StatefulSet and Service selectors)."""
    return {contract.LABEL_JOB: job.metadata.name, contract.LABEL_ROLE: role}


def owner_reference(job: rljob.RLJob, ctx: context.RenderContext) -> Obj:
    """A controller owner reference to the RLJob."""
    return {
        "apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": job.metadata.name, "uid": ctx.uid,
        "controller": True, "blockOwnerDeletion": True,
    }


def metadata(job: rljob.RLJob, ctx: context.RenderContext, *, name: str,
             labels: dict[str, str] | None = None) -> Obj:
    """Metadata of a namespaced child named ``name``."""
    return {
        "name": name, "namespace": ctx.namespace,
        "labels": {**job_labels(job), **(labels or {})},
        "ownerReferences": [owner_reference(job, ctx)],
    }


def key(obj: Obj) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name): identity of a rendered object."""
    md = obj["metadata"]
    return obj["apiVersion"], obj["kind"], md.get("namespace", ""), md["name"]
