"""Headless Services: one per role, giving each pod the stable DNS name its peers dial.

Invariant: ``publishNotReadyAddresses`` is true, so peers resolve each other before they are Ready (roles
handshake among themselves; readiness must never gate discovery, or a gang deadlocks on itself).
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta


def ports() -> list[meta.Obj]:
    """The named ports every role process listens on (base + offset)."""
    return [{"name": n, "port": contract.DEFAULT_PORT_BASE + off, "targetPort": contract.DEFAULT_PORT_BASE + off,
             "protocol": "TCP"} for n, off in names.PORT_NAMES.items()]


def headless_service(job: rljob.RLJob, ctx: context.RenderContext, *, role: str) -> meta.Obj:
    """The headless Service ``<job>-<role>``."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta.metadata(job, ctx, name=contract.child_name(job.metadata.name, role),
                                  labels={contract.LABEL_ROLE: role}),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": meta.role_labels(job, role),
            "ports": ports(),
        },
    }
