"""The sandbox pods of ``spec.sandbox`` (docs/sandboxes.md): the StatefulSet and headless Service ``<job>-sandbox``,
their NetworkPolicy ``<job>-sandbox-network`` and the Secret holding the sandbox key; and what the verifier pods
are told (:func:`client_env`).

Role: pure renderers. A sandbox pod runs model-written programs, so it is rendered to hold nothing:
- restricted Pod Security as the roles' (``render.security``: non-root, no privilege escalation, all capabilities
  dropped, read-only root filesystem, seccomp RuntimeDefault) and **no ServiceAccount token**, no service links;
- no job key, no config map, no secret of the user's (``validate_sandbox`` refuses ``envFrom``, ``valueFrom`` and
  Secret-like volumes; plain env values and hostPath / emptyDir / claimed volumes pass): its one secret is the
  sandbox key (``<job>-sandbox-key``, in ``api.sandboxenv``'s env), which opens sandboxes only;
- **not the job label**: the job's NetworkPolicy admits the job's pods to every port of every job pod; a sandbox
  pod is labelled ``contract.LABEL_SANDBOX_OF`` instead, and its own NetworkPolicy admits the job's verifier pods
  (where CodeExecution and environments run) to the sandbox port, anyone to the metrics port (probes), and lets
  it reach nothing (no egress rule: not even DNS, which the server does not need);
- no gang place, attempt or world annotation: like agent pods, a sandbox pod that dies costs the runs it held;
  ``RollingUpdate``, ``Parallel``.
"""
from __future__ import annotations

from kubeforge.api import contract, rljob, roleenv, sandboxenv
from kubeforge.operator import names
from kubeforge.operator.render import context, env, meta, pods, security
from kubeforge.operator.render import statefulset as role_sets   # the roles' probes

SANDBOX_PORT = contract.DEFAULT_PORT_BASE + contract.PORT_SANDBOX
METRICS_PORT = contract.DEFAULT_PORT_BASE + contract.PORT_METRICS


def _spec(job: rljob.RLJob) -> rljob.SandboxSpec:
    assert job.spec.sandbox is not None
    return job.spec.sandbox


def name(job: rljob.RLJob) -> str:
    """The StatefulSet's and the headless Service's name."""
    return contract.child_name(job.metadata.name, contract.SANDBOX)


def pod_labels(job: rljob.RLJob) -> dict[str, str]:
    """A sandbox pod's labels (and its selector but the managed-by label): never ``contract.LABEL_JOB``."""
    return {contract.LABEL_SANDBOX_OF: job.metadata.name, contract.LABEL_ROLE: contract.SANDBOX,
            contract.LABEL_MANAGED_BY: contract.MANAGED_BY}


def _selector(job: rljob.RLJob) -> dict[str, str]:
    return {contract.LABEL_SANDBOX_OF: job.metadata.name, contract.LABEL_ROLE: contract.SANDBOX}


def container(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    spec = _spec(job)
    variables = sandboxenv.render(
        index=roleenv.FieldRef(f"metadata.labels['{names.LABEL_POD_INDEX}']"), job_name=job.metadata.name,
        port_base=contract.DEFAULT_PORT_BASE, bind_host="0.0.0.0",
        key=roleenv.SecretRef(contract.sandbox_key_secret(job.metadata.name), contract.JOB_KEY_SECRET_KEY),
        slots=spec.slots, max_run_seconds=spec.max_run_seconds, idle_seconds=spec.idle_seconds)
    c: meta.Obj = {
        "name": contract.SANDBOX,
        "image": spec.image or ctx.image,
        **({"command": list(spec.command)} if spec.command else {}),
        "args": ["role", contract.SANDBOX],
        "env": _env(spec, variables),
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
                  {"name": "sandbox", "containerPort": SANDBOX_PORT, "protocol": "TCP"}],
        **role_sets.probes(job),
        "volumeMounts": [*security.writable_mounts(), *[dict(m) for m in spec.volume_mounts]],
        "securityContext": security.container_security_context(),
    }
    res = pods.resources(spec.resources)
    if res:
        c["resources"] = res
    return c


def _env(spec: rljob.SandboxSpec, variables: dict[str, roleenv.Value]) -> list[meta.Obj]:
    """The contract, then the pool's own plain values (``validate_sandbox`` refuses ``valueFrom``), then HOME."""
    out = [env.entry(k, v) for k, v in variables.items()]
    out += [env.own_var(e) for e in spec.env if e.name not in variables]
    taken = {e["name"] for e in out}
    return out + [e for e in security.default_env() if e["name"] not in taken]


def pod_template(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    pod: meta.Obj = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": security.pod_security_context(),
        "restartPolicy": "Always",
        "containers": [container(job, ctx)],
        "volumes": [*security.writable_volumes(), *[dict(v) for v in _spec(job).volumes]],
    }
    pod.update(pods.scheduling(_spec(job), default_pull=ctx.image_pull_secrets))
    return {"metadata": {"labels": pod_labels(job)}, "spec": pod}


def statefulset(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The StatefulSet ``<job>-sandbox`` (it carries the job label, as every child does: its pods do not)."""
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta.metadata(job, ctx, name=name(job), labels={contract.LABEL_ROLE: contract.SANDBOX}),
        "spec": {
            "replicas": _spec(job).replicas if ctx.active else 0,
            "serviceName": name(job),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": _selector(job)},
            "template": pod_template(job, ctx),
        },
    }


def headless_service(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The Service ``<job>-sandbox`` that names each sandbox pod (``contract.sandbox_host``)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta.metadata(job, ctx, name=name(job), labels={contract.LABEL_ROLE: contract.SANDBOX}),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": False, "selector": _selector(job),
                 "ports": [{"name": "sandbox", "port": SANDBOX_PORT, "targetPort": SANDBOX_PORT, "protocol": "TCP"},
                           {"name": "metrics", "port": METRICS_PORT, "targetPort": METRICS_PORT,
                            "protocol": "TCP"}]},
    }


def network_policy(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The NetworkPolicy ``<job>-sandbox-network``: in from the job's verifiers (sandbox port) and anyone (metrics
    port); out to nothing."""
    verifiers = {"podSelector": {"matchLabels": meta.role_labels(job, "verifier")}}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": meta.metadata(job, ctx, name=f"{name(job)}-network"),
        "spec": {
            "podSelector": {"matchLabels": _selector(job)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [verifiers], "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}]},
                {"ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
            ],
            "egress": [],
        },
    }


def key_secret(job: rljob.RLJob, ctx: context.RenderContext, *, key_hex: str) -> meta.Obj:
    """The Secret ``<job>-sandbox-key``: drawn once by ``reconcile`` and created only when absent, as the job key;
    the sandbox pods and the verifier pods read it, nothing else."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": meta.metadata(job, ctx, name=contract.sandbox_key_secret(job.metadata.name)),
        "stringData": {contract.JOB_KEY_SECRET_KEY: key_hex},
    }


def client_env(job: rljob.RLJob, ctx: context.RenderContext) -> dict[str, roleenv.Value]:
    """What a verifier pod is told: every sandbox pod's stable address and the sandbox key (empty without
    ``spec.sandbox``)."""
    if job.spec.sandbox is None:
        return {}
    hosts = [roleenv.Peer(host=contract.sandbox_host(job.metadata.name, i, ctx.namespace),
                          port_base=contract.DEFAULT_PORT_BASE) for i in range(job.spec.sandbox.replicas)]
    return sandboxenv.client_env(sandboxes=hosts, key=roleenv.SecretRef(
        contract.sandbox_key_secret(job.metadata.name), contract.JOB_KEY_SECRET_KEY))


def objects(job: rljob.RLJob, ctx: context.RenderContext) -> list[meta.Obj]:
    """The sandbox pool's children, in apply order (what pods need before the StatefulSet)."""
    return [network_policy(job, ctx), headless_service(job, ctx), statefulset(job, ctx)]
