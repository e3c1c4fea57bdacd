"""Gang backends, chosen by ``spec.gang.backend`` from a registry (one module per backend).

Add a backend: write a module with ``render(job, ctx) -> base.GangParts`` and register it here. ``Auto`` has no
module: the operator resolves it per job (``kubeforge.operator.gangauto``) into ``ctx.gang_backend``.
"""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator.render import context
from kubeforge.operator.render.gang import base, coscheduling, kai, kueue, none, volcano

REGISTRY: dict[str, base.Backend] = {
    rljob.GangBackend.COSCHEDULING.value: coscheduling.render,
    rljob.GangBackend.VOLCANO.value: volcano.render,
    rljob.GangBackend.KAI.value: kai.render,
    rljob.GangBackend.KUEUE.value: kueue.render,
    rljob.GangBackend.NONE.value: none.render,
}


#: What each backend that creates objects needs installed: (API group of its objects, what provides it).
REQUIRES: dict[str, tuple[str, str]] = {
    rljob.GangBackend.COSCHEDULING.value: (
        coscheduling.API_VERSION.split("/")[0],
        "scheduler-plugins (its PodGroup CRD and a scheduler with the Coscheduling plugin)"),
    rljob.GangBackend.VOLCANO.value: (volcano.API_VERSION.split("/")[0], "Volcano (its CRDs and scheduler)"),
    rljob.GangBackend.KAI.value: (kai.API_VERSION.split("/")[0], "the KAI scheduler (its CRDs and scheduler)"),
}


def backend(job: rljob.RLJob, ctx: context.RenderContext) -> str:
    """The backend that renders ``job``: its own, or for Auto the one the operator chose (``ctx.gang_backend``;
    None while unresolved)."""
    own = str(job.spec.gang.backend)
    if own != rljob.GangBackend.AUTO.value:
        return own
    return ctx.gang_backend or rljob.GangBackend.NONE.value


def render(job: rljob.RLJob, ctx: context.RenderContext) -> base.GangParts:
    """The gang parts of ``job`` from its backend."""
    return REGISTRY[backend(job, ctx)](job, ctx)


def explain_refusal(job: rljob.RLJob, status: int, message: str, *, chosen: str | None = None) -> str:
    """``message`` (an API server's refusal of an apply) with what is missing when it is a 404 for the gang
    backend's API group (``chosen``: the backend rendered, default the spec's): the cluster does not serve the
    backend's objects, so the job can never start."""
    name = chosen or str(job.spec.gang.backend)
    need = REQUIRES.get(name)
    if status != 404 or need is None or f"/apis/{need[0]}/" not in message:
        return message
    return (f"spec.gang.backend {name}: this cluster does not serve the {need[0]} API; install "
            f"{need[1]}, or set spec.gang.backend: None (no gang scheduling). API server: {message}")
