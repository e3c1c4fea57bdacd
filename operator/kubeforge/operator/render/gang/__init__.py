"""Gang backends, chosen by ``spec.gang.backend`` from a registry (one module per backend).

Add a backend: write a module with ``render(job, ctx) -> base.GangParts`` and register it here.
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


def render(job: rljob.RLJob, ctx: context.RenderContext) -> base.GangParts:
    """The gang parts of ``job`` from its backend."""
    return REGISTRY[str(job.spec.gang.backend)](job, ctx)
