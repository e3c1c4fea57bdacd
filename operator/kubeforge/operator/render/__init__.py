"""Pure renderers: (RLJob, RenderContext) → the desired child objects, and the objects that must not exist.

Role: the "render" step of observe → render → apply → status → write. Nothing here talks to the API server or
reads a clock. Neighbours: ``lifecycle`` builds the context; ``apply`` server-side-applies ``desired`` and deletes
``absent``. Invariant: ``desired`` is ordered so that what pods need (config, identity, Services, the gang object)
is applied before the StatefulSets that create pods.
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import rljob
from kubeforge.operator.render import agent, config, context, meta, network, rbac, sandbox, service, statefulset
from kubeforge.operator.render import gang as gangs


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rendered:
    desired: tuple[meta.Obj, ...]
    absent: tuple[meta.Obj, ...] = ()


def render(job: rljob.RLJob, ctx: context.RenderContext) -> Rendered:
    """Every child of ``job`` for this context."""
    gang = gangs.render(job, ctx)
    desired: list[meta.Obj] = [config.config_map(job, ctx), *rbac.objects(job, ctx), network.network_policy(job, ctx)]
    desired.append(service.headless_service(job, ctx))
    absent: list[meta.Obj] = []
    (desired if ctx.gang_active else absent).extend(gang.objects)
    # a job on a GeneratorPool (spec.generatorPool) runs no generators of its own: its roles dial the pool's engines
    desired += [statefulset.statefulset(job, ctx, gang, role=r) for r in job.spec.own_roles()]
    if job.spec.roles.generator.min_replicas is not None and "generator" in job.spec.own_roles():
        # generators beyond it: outside the gang
        desired.append(statefulset.surplus_statefulset(job, ctx, gang))
    elif ctx.surplus_present:
        absent.append(statefulset.surplus_ref(job, ctx))
    if job.spec.agent is not None:      # the user's agent pods: no gang place (render/agent.py)
        desired.append(agent.statefulset(job, ctx))
    if job.spec.sandbox is not None:    # the warm pool of sandbox pods: no gang place (render/sandbox.py)
        desired += sandbox.objects(job, ctx)
    return Rendered(desired=tuple(desired), absent=tuple(absent))
