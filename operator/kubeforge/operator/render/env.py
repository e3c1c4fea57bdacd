"""The env contract of a role's container (``kubeforge.api.roleenv.render``), as Kubernetes env entries.

Role: tells each process who it is (role, index, attempt; a trainer its epoch), who its peers are (stable DNS names behind the
job's headless Service, all at ``contract.DEFAULT_PORT_BASE``; a GeneratorPool's engines at the job's own port block
there) and how big each role is. The same variables the local
launcher sets for a plain process. Invariant: peers and world sizes come from the spec alone, so every pod of an
attempt sees the same world (a replica change starts a new attempt; see ``lifecycle``).
"""
from __future__ import annotations

from kubeforge.api import contract, rljob, roleenv
from kubeforge.operator import names
from kubeforge.operator.render import context, meta, sandbox


def peers(job: rljob.RLJob, role: str, namespace: str, *, pool_engines: int = 0,
          pool_port_base: int = contract.DEFAULT_PORT_BASE) -> list[roleenv.Peer]:
    """Every replica of ``role`` by index, at its stable DNS name and the pods' one port base; a job on a
    GeneratorPool's generators are the pool's ``pool_engines`` engines (``contract.pool_peer_host``) at the port
    base the pool serves the job at (``pool_port_base``: its block on every engine, ``poolports``)."""
    pool = job.spec.generator_pool
    if role == "generator" and pool is not None:
        return [roleenv.Peer(host=contract.pool_peer_host(pool.name, i, namespace),
                             port_base=pool_port_base) for i in range(pool_engines)]
    n = getattr(job.spec.roles, role).replicas
    held = job.spec.roles.generator.gang_held()     # generators beyond it are the surplus StatefulSet's pods
    return [roleenv.Peer(host=names.peer_host(job.metadata.name, role, i, namespace, gang_held=held),
                         port_base=contract.DEFAULT_PORT_BASE) for i in range(n)]


def entry(name: str, value: roleenv.Value) -> meta.Obj:
    """One contract variable as a Kubernetes EnvVar (a literal, a downward-API field or a Secret key)."""
    if isinstance(value, roleenv.FieldRef):
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": value.path}}}
    if isinstance(value, roleenv.SecretRef):
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": value.name, "key": value.key}}}
    return {"name": name, "value": value}


def role_env(job: rljob.RLJob, ctx: context.RenderContext, *, role: str) -> list[meta.Obj]:
    """Env entries of ``role``'s container: the contract first (``roleenv.render``), then the role's own ``env``."""
    contract_env = roleenv.render(
        role=role, index=roleenv.FieldRef(f"metadata.labels['{names.LABEL_POD_INDEX}']"),
        config_path=names.CONFIG_PATH, job_name=job.metadata.name,
        namespace=roleenv.FieldRef("metadata.namespace"), pod_name=roleenv.FieldRef("metadata.name"),
        port_base=contract.DEFAULT_PORT_BASE, bind_host="0.0.0.0", attempt=ctx.attempt,
        report=roleenv.REPORT_POD_ANNOTATION,
        job_key=roleenv.SecretRef(ctx.key_secret or contract.job_key_secret(job.metadata.name),
                                  contract.JOB_KEY_SECRET_KEY),
        peers={other: peers(job, other, ctx.namespace, pool_engines=ctx.pool_engines,
                            pool_port_base=ctx.pool_port_base) for other in contract.ROLES},
        # the pod's own label (statefulset.py), so env and label agree for the pod's whole life (docs/fencing.md)
        trainer_epoch=roleenv.FieldRef(f"metadata.labels['{contract.LABEL_TRAINER_EPOCH}']")
        if role == "trainer" else None)
    fixed = [entry(name, value) for name, value in contract_env.items()]
    if role == "generator" and job.spec.agent is not None:     # the agents endpoint (render/agent.py)
        fixed += [entry(contract.ENV_AGENT_KEY, roleenv.SecretRef(contract.agent_key_secret(job.metadata.name),
                                                                  contract.JOB_KEY_SECRET_KEY)),
                  entry(contract.ENV_POD_IP, roleenv.FieldRef("status.podIP"))]
        contract_env = {**contract_env, contract.ENV_AGENT_KEY: "", contract.ENV_POD_IP: ""}
    if role == "verifier" and job.spec.sandbox is not None:   # the sandbox pool's clients (render/sandbox.py)
        pool = sandbox.client_env(job, ctx)
        fixed += [entry(name, value) for name, value in pool.items()]
        contract_env = {**contract_env, **{name: "" for name in pool}}
    extra = [own_var(e) for e in getattr(job.spec.roles, role).env if e.name not in contract_env]
    return fixed + extra


def _key_ref(ref: rljob.KeySelector) -> meta.Obj:
    return {"name": ref.name, "key": ref.key, **({"optional": True} if ref.optional else {})}


def own_var(e: rljob.EnvVar) -> meta.Obj:
    """A role's own variable as a Kubernetes EnvVar: its value, or where the kubelet reads it from."""
    src = e.value_from
    if src is None:
        return {"name": e.name, "value": e.value or ""}
    if src.secret_key_ref is not None:
        return {"name": e.name, "valueFrom": {"secretKeyRef": _key_ref(src.secret_key_ref)}}
    assert src.config_map_key_ref is not None      # the model holds exactly one
    return {"name": e.name, "valueFrom": {"configMapKeyRef": _key_ref(src.config_map_key_ref)}}


def env_from(spec: rljob.PodSettings) -> list[meta.Obj]:
    """A role's ``envFrom`` as Kubernetes EnvFromSources (its ``env`` and the contract, rendered as ``env``, win
    over a key of the same name: the kubelet lets ``env`` override ``envFrom``)."""
    out = []
    for s in spec.env_from:
        kind, ref = ("secretRef", s.secret_ref) if s.secret_ref is not None else ("configMapRef", s.config_map_ref)
        assert ref is not None                     # the model holds exactly one
        out.append({**({"prefix": s.prefix} if s.prefix else {}),
                    kind: {"name": ref.name, **({"optional": True} if ref.optional else {})}})
    return out
