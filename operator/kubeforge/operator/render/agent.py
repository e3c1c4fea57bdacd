"""The agent pods of ``spec.agent`` (docs/agents.md, "Agents in their own pods"): the StatefulSet ``<job>-agent`` and
the Secret holding the agent key.

Role: pure renderers. The pods render like the roles' (``render.security``: non-root, no privilege escalation, a
read-only root filesystem, seccomp RuntimeDefault, no ServiceAccount token; the config mount; probes on the metrics
port; the job label, so the job's NetworkPolicy admits them to the generators and nothing else does), with three
differences, each on purpose:
- their env is ``api.agentenv``'s: the generators' addresses behind the job's Service and the agent key from
  ``<job>-agent-key``; never the job key (``<job>-key``): an agent pod can claim episodes and call the model with
  each claimed episode's own credential, nothing more;
- no gang membership, no attempt label, no world annotation: the job's progress never waits for an agent pod, a new
  attempt does not restart them, and one that dies costs its episodes only (``agent_lost``: not trained on,
  sampled again), while its StatefulSet brings it back;
- ``RollingUpdate``: agent pods hold no state a new template could split, unlike the roles (``OnDelete``).
"""
from __future__ import annotations

from kubeforge.api import agentenv, contract, rljob, roleenv
from kubeforge.operator import names
from kubeforge.operator.render import context, env, meta, placement, pods, security
from kubeforge.operator.render import statefulset as role_sets   # the roles' StatefulSets: their probes


def _agent(job: rljob.RLJob) -> rljob.AgentSpec:
    assert job.spec.agent is not None
    return job.spec.agent


def _env(job: rljob.RLJob, ctx: context.RenderContext) -> list[meta.Obj]:
    contract_env = agentenv.render(
        index=roleenv.FieldRef(f"metadata.labels['{names.LABEL_POD_INDEX}']"), config_path=names.CONFIG_PATH,
        job_name=job.metadata.name, namespace=roleenv.FieldRef("metadata.namespace"),
        pod_name=roleenv.FieldRef("metadata.name"), generators=env.peers(job, "generator", ctx.namespace),
        port_base=contract.DEFAULT_PORT_BASE, bind_host="0.0.0.0",
        agent_key=roleenv.SecretRef(contract.agent_key_secret(job.metadata.name), contract.JOB_KEY_SECRET_KEY))
    out = [env.entry(name, value) for name, value in contract_env.items()]
    out += [env.own_var(e) for e in _agent(job).env if e.name not in contract_env]
    taken = {e["name"] for e in out}
    return out + [e for e in security.default_env() if e["name"] not in taken]


def container(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The agent pod's one container: the image's entrypoint with ``role agent`` (``command`` replaces the
    entrypoint, as for a role)."""
    spec = _agent(job)
    port = contract.DEFAULT_PORT_BASE + contract.PORT_METRICS
    c: meta.Obj = {
        "name": contract.AGENT,
        "image": spec.image or ctx.image,
        **({"command": list(spec.command)} if spec.command else {}),
        "args": ["role", contract.AGENT],
        "env": _env(job, ctx),
        **({"envFrom": env.env_from(spec)} if spec.env_from else {}),
        "ports": [{"name": "metrics", "containerPort": port, "protocol": "TCP"}],
        **role_sets.probes(job),
        **pods.container_fields(spec),
    }
    return c


def pod_template(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    spec = _agent(job)
    pod: meta.Obj = {
        "serviceAccountName": names.service_account(job.metadata.name),
        "automountServiceAccountToken": False,
        "securityContext": security.pod_security_context(),
        "restartPolicy": "Always",
        "containers": [container(job, ctx)],
        "volumes": [{"name": names.CONFIG_VOLUME, "configMap": {"name": names.config_map(job.metadata.name)}},
                    *security.writable_volumes(), *[dict(v) for v in spec.volumes]],
    }
    aff = placement.affinity(job)        # the job's packing and exclusivity hold for its agent pods too
    if aff:
        pod["affinity"] = aff
    pod.update(pods.scheduling(spec, default_pull=ctx.image_pull_secrets))
    return {"metadata": {"labels": {**meta.job_labels(job), contract.LABEL_ROLE: contract.AGENT}}, "spec": pod}


def statefulset(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The StatefulSet ``<job>-agent``."""
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta.metadata(job, ctx, name=contract.child_name(job.metadata.name, contract.AGENT),
                                  labels={contract.LABEL_ROLE: contract.AGENT}),
        "spec": {
            "replicas": _agent(job).replicas if ctx.active else 0,
            "serviceName": contract.service_name(job.metadata.name),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": meta.role_labels(job, contract.AGENT)},
            "template": pod_template(job, ctx),
        },
    }


def agent_key_secret(job: rljob.RLJob, ctx: context.RenderContext, *, key_hex: str) -> meta.Obj:
    """The Secret ``<job>-agent-key``: drawn once by ``reconcile`` and created only when absent, as the job key
    (``render/secret.py``); generators and agent pods read it, nothing else."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": meta.metadata(job, ctx, name=contract.agent_key_secret(job.metadata.name)),
        "stringData": {contract.JOB_KEY_SECRET_KEY: key_hex},
    }


def ref(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """Just enough of the agent StatefulSet to delete it (``spec.agent`` removed)."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": contract.child_name(job.metadata.name, contract.AGENT), "namespace": ctx.namespace}}
