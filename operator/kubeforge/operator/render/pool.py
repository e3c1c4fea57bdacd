"""Pure renderer of a GeneratorPool: (pool, PoolContext) → its ConfigMaps, key Secret, headless Service,
NetworkPolicy and StatefulSet of engines.

Role: the "render" step for the pool kind (``poolreconcile`` applies the result; ``render`` is the RLJob's). The
engines are generator pods (``kubeforge role generator`` with ``contract.ENV_POOL`` set) whose vLLM arguments come
from the pool's spec (``generatorpool.engine_args``: LoRA enabled for ``maxAdapters`` adapters up to
``maxLoraRank``), written into the pool's ConfigMap beside its manifest. Attached jobs dial the engines by their
stable names behind the Service (``contract.pool_peer_host``). The NetworkPolicy lets only the pods of the attached
jobs (``PoolContext.attached``) and the pool's own reach the engines' ports; ``metrics`` stays open to scrapers and
probes (as a job's: ``render.network``).

What the engines serve (``PoolContext.members``: the attached jobs that have a port block, neither suspended nor
finished) is the jobs file in the ConfigMap ``<pool>-pool-jobs`` (each job's name, namespace, UID, slot, port base on
every engine, trainer and verifier pods, and its manifest beside it), which the runtime reads
(``generator.pool.attach``), and the pool's key in the Secret ``<pool>-pool-key-<key id>`` (:func:`key_secret`: created
once by the pool's pass, never applied nor read back), from which an engine derives each listed job's key
(``kubeforge.api.poolkeys``). Both are projected with the pool's config into one folder (``names.CONFIG_DIR``) as whole
objects, never ``subPath``, so the kubelet refreshes the jobs file in place when a job attaches or goes
(docs/generator-pool.md: an engine re-reads it; the pod template does not change).

Invariants: every child is named from the pool's name (``contract.pool_service``), labelled ``contract.LABEL_POOL``
(never ``LABEL_JOB``: no job's watch routes a pool's pods) and owned by the GeneratorPool (deleting it collects
them); the pod template shares the roles' security, probes and ports (``render.security``, ``render.service``);
Parallel pod management and ``OnDelete`` updates as the roles' StatefulSets; the same inputs render the same bytes;
no key is rendered but into a Secret (the pool's key: only the pool's engines mount it; a job's pods see their own
key Secret alone); the pod template depends on no member, so attaching a job restarts no engine.
"""
from __future__ import annotations

import dataclasses
import json

import yaml

from kubeforge.api import contract, generatorpool, load, rljob
from kubeforge.operator import names, poolports
from kubeforge.operator.render import config, env, meta, pods, security, service

ROLE = "generator"
#: How long an engine may take to start before its startupProbe fails it: a job's default start allowance.
START_SECONDS = rljob.FailurePolicySpec().start_deadline_seconds()


#: Mode of the engines' config folder: read by the runtime's UID through the pod's ``fsGroup``, by no one else.
CONFIG_MODE = 0o440


@dataclasses.dataclass(frozen=True, kw_only=True)
class Member:
    """An attached job the engines serve: the job (its manifest goes into the jobs file), its UID (an engine derives
    the job's key from it) and its port base (``poolports``)."""

    job: rljob.RLJob
    uid: str
    port_base: int

    @property
    def name(self) -> str:
        return self.job.metadata.name


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolContext:
    """What a pool's render depends on besides its spec: its namespace and UID (owner references), the operator's
    runtime image and default imagePullSecrets (as ``context.RenderContext`` for jobs), the RLJobs attached to it
    (names, sorted: ``poolstatus.attached_jobs``), whose pods its NetworkPolicy admits, and the ``members`` among
    them the engines serve (sorted by name; a job without a port block yet, suspended or finished, is attached, not
    a member); ``key_id``: the fingerprint of the pool's key (``poolkeys.key_id``), which names the Secret holding it
    (``names.pool_key_secret``)."""

    namespace: str
    uid: str
    key_id: str = ""
    attached: tuple[str, ...] = ()
    members: tuple[Member, ...] = ()
    image: str = names.DEFAULT_RUNTIME_IMAGE
    image_pull_secrets: tuple[str, ...] = ()


def labels(pool: generatorpool.GeneratorPool) -> dict[str, str]:
    """Labels of every child and pod of ``pool`` (the Service and StatefulSet select by ``LABEL_POOL``)."""
    return {contract.LABEL_POOL: pool.metadata.name, contract.LABEL_MANAGED_BY: contract.MANAGED_BY}


def metadata(pool: generatorpool.GeneratorPool, ctx: PoolContext, *, name: str) -> meta.Obj:
    owner = {"apiVersion": contract.API_VERSION, "kind": contract.POOL_KIND, "name": pool.metadata.name,
             "uid": ctx.uid, "controller": True, "blockOwnerDeletion": True}
    return {"name": name, "namespace": ctx.namespace, "labels": labels(pool), "ownerReferences": [owner]}


def config_map(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    """``<pool>-pool-config``: the manifest (no status) and the engine arguments."""
    doc = load.dump(pool)
    doc.pop("status", None)
    doc["metadata"] = {"name": pool.metadata.name, "namespace": ctx.namespace}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(pool, ctx, name=names.pool_config_map(pool.metadata.name)),
            "data": {names.POOL_CONFIG_FILE: yaml.safe_dump(doc, sort_keys=True),
                     names.POOL_ENGINE_FILE: json.dumps(generatorpool.engine_args(pool.spec), sort_keys=True)}}


def jobs_entry(pool: generatorpool.GeneratorPool, ctx: PoolContext, m: Member) -> dict[str, object]:
    """One job of the jobs file (``generator.pool.attach``): where every engine serves it and where its roles are."""
    job = m.job
    return {"name": m.name, "namespace": ctx.namespace, "uid": m.uid, "slot": poolports.slot(m.port_base),
            "manifest": f"{names.CONFIG_DIR}/{names.pool_job_manifest(m.name)}",
            "portBases": [m.port_base] * pool.spec.replicas,
            "peers": {role: [p.render() for p in env.peers(job, role, ctx.namespace)] for role in ("trainer", "verifier")}}


def jobs_config_map(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    """``<pool>-pool-jobs``: the jobs file and each member's manifest (as its own roles read it: ``config``)."""
    data = {names.POOL_JOBS_FILE: json.dumps({"jobs": [jobs_entry(pool, ctx, m) for m in ctx.members]},
                                             indent=1, sort_keys=True)}
    data.update({names.pool_job_manifest(m.name): config.manifest_yaml(m.job) for m in ctx.members})
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": metadata(pool, ctx, name=names.pool_jobs_config_map(pool.metadata.name)), "data": data}


def key_secret(pool: generatorpool.GeneratorPool, ctx: PoolContext, *, key_hex: str) -> meta.Obj:
    """``<pool>-pool-key-<key id>``: the pool's key, from which its engines derive each attached job's; created when
    absent (``apply.Cluster.create_if_absent``), never applied: the operator holds ``create`` on Secrets only."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": metadata(pool, ctx, name=names.pool_key_secret(pool.metadata.name, ctx.key_id)),
            "stringData": {names.POOL_KEY_FILE: key_hex}}


def headless_service(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    """The headless Service ``<pool>-pool``: every engine's stable DNS name, ready or not (as a job's Service)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(pool, ctx, name=contract.pool_service(pool.metadata.name)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {contract.LABEL_POOL: pool.metadata.name}, "ports": service.ports()}}


def network_policy(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    """``<pool>-pool-network``: the engines' ports for the attached jobs' pods and the pool's own; metrics for all."""
    own = {"matchLabels": {contract.LABEL_POOL: pool.metadata.name}}
    peers: list[meta.Obj] = [{"podSelector": own}]
    if ctx.attached:
        peers.append({"podSelector": {"matchExpressions": [
            {"key": contract.LABEL_JOB, "operator": "In", "values": list(ctx.attached)}]}})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata(pool, ctx, name=f"{contract.pool_service(pool.metadata.name)}-network"),
            "spec": {"podSelector": own, "policyTypes": ["Ingress"],
                     "ingress": [{"from": peers}, {"ports": [
                         {"protocol": "TCP", "port": contract.DEFAULT_PORT_BASE + contract.PORT_METRICS}]}]}}


def _env(pool: generatorpool.GeneratorPool) -> list[meta.Obj]:
    own = {contract.ENV_ROLE: ROLE, contract.ENV_POOL: pool.metadata.name,
           contract.ENV_CONFIG: f"{names.CONFIG_DIR}/{names.POOL_CONFIG_FILE}",
           contract.ENV_POOL_JOBS: f"{names.CONFIG_DIR}/{names.POOL_JOBS_FILE}",
           contract.ENV_POOL_KEY: f"{names.CONFIG_DIR}/{names.POOL_KEY_FILE}",
           contract.ENV_PORT_BASE: str(contract.DEFAULT_PORT_BASE), contract.ENV_BIND_HOST: "0.0.0.0"}
    out: list[meta.Obj] = [{"name": k, "value": v} for k, v in own.items()]
    out += [{"name": contract.ENV_INDEX,
             "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{names.LABEL_POD_INDEX}']"}}},
            {"name": contract.ENV_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": contract.ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    taken = {e["name"] for e in out}
    out += [env.own_var(e) for e in pool.spec.env if e.name not in taken]
    taken |= {e.name for e in pool.spec.env}
    return out + [e for e in security.default_env() if e["name"] not in taken]


def container(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    """The engine's container: the runtime image's entrypoint with ``role generator``."""
    spec = pool.spec
    c: meta.Obj = {
        "name": ROLE, "image": spec.image or ctx.image,
        **({"command": list(spec.command)} if spec.command else {}),
        "args": ["role", ROLE], "env": _env(pool),
        **({"envFrom": env.env_from(spec)} if spec.env_from else {}),
        "ports": [{"name": p["name"], "containerPort": p["port"], "protocol": "TCP"} for p in service.ports()],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5,
                           "failureThreshold": 3},
        "startupProbe": {"httpGet": {"path": "/startz", "port": "metrics"}, "periodSeconds": 10,
                         "timeoutSeconds": 5, "failureThreshold": -(-START_SECONDS // 10)},
        **pods.container_fields(spec),
    }
    return c


def config_volume(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    """The engines' config folder: the pool's config, its jobs file and manifests, its key, projected whole."""
    name = pool.metadata.name
    return {"name": names.CONFIG_VOLUME, "projected": {"defaultMode": CONFIG_MODE, "sources": [
        {"configMap": {"name": names.pool_config_map(name)}},
        {"configMap": {"name": names.pool_jobs_config_map(name)}},
        {"secret": {"name": names.pool_key_secret(name, ctx.key_id)}}]}}


def pod_template(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    spec = pool.spec
    shm = pods.shm_gib(spec, tensor_parallel=spec.tensor_parallel_size)
    pod: meta.Obj = {
        "automountServiceAccountToken": False,
        "securityContext": security.pod_security_context(),
        "restartPolicy": "Always",
        "containers": [container(pool, ctx)],
        "volumes": [config_volume(pool, ctx), *security.writable_volumes(), *[dict(v) for v in spec.volumes]],
    }
    if shm:
        pod["containers"][0]["volumeMounts"].append(dict(pods.SHM_MOUNT))
        pod["volumes"].append(pods.shm_volume(shm))
    pod.update(pods.scheduling(spec, default_pull=ctx.image_pull_secrets))
    return {"metadata": {"labels": {**labels(pool), contract.LABEL_ROLE: ROLE}}, "spec": pod}


def statefulset(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> meta.Obj:
    """The StatefulSet ``<pool>-pool``: ``spec.replicas`` engines, pods ``<pool>-pool-<i>``."""
    name = contract.pool_service(pool.metadata.name)
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": metadata(pool, ctx, name=name),
            "spec": {"replicas": pool.spec.replicas, "serviceName": name, "podManagementPolicy": "Parallel",
                     "updateStrategy": {"type": "OnDelete"},
                     "selector": {"matchLabels": {contract.LABEL_POOL: pool.metadata.name}},
                     "template": pod_template(pool, ctx)}}


def render(pool: generatorpool.GeneratorPool, ctx: PoolContext) -> tuple[meta.Obj, ...]:
    """Every child of ``pool`` the operator applies, what the engines need (config, jobs, Service, NetworkPolicy)
    before the StatefulSet (the key Secret is created apart: :func:`key_secret`)."""
    return (config_map(pool, ctx), jobs_config_map(pool, ctx), headless_service(pool, ctx),
            network_policy(pool, ctx), statefulset(pool, ctx))
