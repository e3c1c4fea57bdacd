"""The job's headless Service: one for every role, giving each pod the stable DNS name its peers dial.

One Service, not one per role: pod names (``<job>-<role>-<i>``) are unique across roles, so every pod can be named
under the same subdomain (``contract.peer_host``), and each Service costs the control plane an Endpoints object
and an EndpointSlice rewritten on every change of a pod it selects (one Service per job batches a gang's changes
into one write instead of three). Invariant: ``publishNotReadyAddresses`` is true, so peers resolve each other
before they are Ready (roles handshake among themselves; readiness must never gate discovery, or a gang
deadlocks on itself).
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta


def ports() -> list[meta.Obj]:
    """The named ports every role process listens on (base + offset)."""
    return [{"name": n, "port": contract.DEFAULT_PORT_BASE + off, "targetPort": contract.DEFAULT_PORT_BASE + off,
             "protocol": "TCP"} for n, off in names.PORT_NAMES.items()]


def headless_service(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The headless Service ``<job>`` selecting every pod of the job."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta.metadata(job, ctx, name=contract.service_name(job.metadata.name)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {contract.LABEL_JOB: job.metadata.name},
            "ports": ports(),
        },
    }
