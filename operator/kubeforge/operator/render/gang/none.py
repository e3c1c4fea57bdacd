"""No gang: pods are scheduled one by one by the default scheduler (a partial job can start)."""
from __future__ import annotations

from kubeforge.api import rljob
from kubeforge.operator.render import context
from kubeforge.operator.render.gang import base


def render(job: rljob.RLJob, ctx: context.RenderContext) -> base.GangParts:
    return base.GangParts()
