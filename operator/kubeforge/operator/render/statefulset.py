"""One StatefulSet per role: ``<job>-<role>``, Parallel pod management, pods labelled with job, role, attempt.

Role: the pod template is where the env contract, the config mount, resources, ports, the readiness probe,
placement and the gang's pod labels meet. Invariants:
- ``podManagementPolicy: Parallel`` (ordered creation deadlocks a gang);
- the selector holds only job and role (immutable, attempt-independent);
- ``updateStrategy: OnDelete``: the operator alone decides when pods go (a whole attempt at a time), so the
  StatefulSet controller never rolls pods one by one into a mixed world;
- replicas are 0 unless the context is active (suspended, finished, or an old attempt still draining);
- a pod that talks NCCL or runs vLLM tensor parallelism (it requests GPUs, or a generator has
  ``tensorParallelSize > 1``) gets a memory-backed ``/dev/shm`` sized per GPU (``render.pods``).
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator import names
from kubeforge.operator.render import checkpoint, context, env, meta, placement, pods, security, service
from kubeforge.operator.render.gang import base

# The runtime image's ENTRYPOINT is ``tini -- kubeforge`` (images/runtime/Containerfile): a pod leaves ``command``
# unset so tini stays PID 1 (forwards SIGTERM, reaps vLLM's children) and gets only ``args: [role, <role>]``.
# Setting ``command: [kubeforge]`` would replace the entrypoint and make the role process PID 1, which ignores
# SIGTERM without a handler (the trainer has none): every restart would wait out the grace period.


SHM_VOLUME = pods.SHM_VOLUME


def shm_gib(spec: rljob.RoleSpec) -> int:
    """GiB of ``/dev/shm`` a role's pod needs: 0 when it uses neither GPUs nor vLLM tensor parallelism."""
    return pods.shm_gib(spec, tensor_parallel=spec.tensor_parallel_size if isinstance(spec, rljob.GeneratorRole)
                        else 1)


def world(job: rljob.RLJob) -> str:
    """Replica counts a pod was rendered for, e.g. ``verifier=1,trainer=1``. Generators are not part of it: their
    count may change while the job runs (the trainer follows it), so a change never starts a new attempt."""
    return ",".join(f"{r}={n}" for r, n in base.replicas(job).items() if r != "generator")


def _env(job: rljob.RLJob, ctx: context.RenderContext, *, role: str) -> list[meta.Obj]:
    """The env contract and the role's env, then the security defaults the role does not set itself."""
    out = env.role_env(job, ctx, role=role)
    taken = {e["name"] for e in out}
    return out + [e for e in security.default_env() if e["name"] not in taken]


STARTUP_PERIOD_SECONDS = 10


def startup_probe(job: rljob.RLJob) -> meta.Obj:
    """The startupProbe: ``/startz`` every 10 s, failing the container only after
    ``spec.failurePolicy.start_deadline_seconds()`` (a multiple of progressDeadlineSeconds) without a start."""
    allowance = job.spec.failure_policy.start_deadline_seconds()
    return {"httpGet": {"path": "/startz", "port": "metrics"}, "periodSeconds": STARTUP_PERIOD_SECONDS,
            "timeoutSeconds": 5, "failureThreshold": -(-allowance // STARTUP_PERIOD_SECONDS)}


def probes(job: rljob.RLJob) -> meta.Obj:
    """The readiness, startup and liveness probes of a role's container (and an agent pod's), on the metrics port."""
    return {
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"},
                           "periodSeconds": 5, "failureThreshold": 3},
        # a start is not a hang: no liveness probe runs until /startz answers 200 (the role is ready: its model or
        # vLLM engine is loaded, which makes no heartbeat); the start may take start_deadline_seconds()
        "startupProbe": startup_probe(job),
        # /healthz turns 503 once the role's heartbeat is older than spec.failurePolicy.progressDeadlineSeconds
        # (the role decides; the probe only asks): three misses in a row restart the container.
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"},
                          "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
    }


def container(job: rljob.RLJob, ctx: context.RenderContext, *, role: str) -> meta.Obj:
    """The role's container: the image's entrypoint with ``role <role>`` (a role's ``command`` replaces it)."""
    spec: rljob.RoleSpec = getattr(job.spec.roles, role)
    c: meta.Obj = {
        "name": role,
        "image": spec.image or ctx.image,
        **({"command": list(spec.command)} if spec.command else {}),
        "args": ["role", role],
        "env": _env(job, ctx, role=role),
        **({"envFrom": env.env_from(spec)} if spec.env_from else {}),
        "ports": [{"name": p["name"], "containerPort": p["port"], "protocol": "TCP"} for p in service.ports()],
        **probes(job),
        "volumeMounts": [{"name": names.CONFIG_VOLUME, "mountPath": names.CONFIG_DIR, "readOnly": True},
                         *security.writable_mounts(), *checkpoint.mounts(job, role),
                         *[dict(m) for m in spec.volume_mounts]],
        "securityContext": security.container_security_context(),
    }
    res = pods.resources(spec.resources)
    if res:
        c["resources"] = res
    if shm_gib(spec):
        c["volumeMounts"].append(dict(pods.SHM_MOUNT))
    return c


def pod_template(job: rljob.RLJob, ctx: context.RenderContext, gang: base.GangParts, *, role: str,
                 surplus: bool = False) -> meta.Obj:
    """A role's pod template; ``surplus``: the surplus generators' (the gang's membership labels and annotations
    replaced by ``gang.surplus_labels``/``surplus_annotations``, ``LABEL_SURPLUS`` added)."""
    spec: rljob.RoleSpec = getattr(job.spec.roles, role)
    labels = {**meta.job_labels(job), contract.LABEL_ROLE: role, contract.LABEL_ATTEMPT: str(ctx.attempt)}
    if role == "trainer":     # what the trainer's writes carry (render/env.py reads it back: docs/fencing.md)
        labels[contract.LABEL_TRAINER_EPOCH] = str(ctx.trainer_epoch)
    annotations = {names.ANNOTATION_WORLD: world(job)}
    if surplus:
        labels.update({**gang.surplus_labels, names.LABEL_SURPLUS: "true"})
        annotations.update(gang.surplus_annotations)
    else:
        labels.update({**gang.pod_labels, **gang.role_labels.get(role, {})})
        annotations.update({**gang.pod_annotations, **gang.role_annotations.get(role, {})})
    pod: meta.Obj = {
        "serviceAccountName": names.service_account(job.metadata.name),
        "automountServiceAccountToken": security.automount_token(role),
        "securityContext": security.pod_security_context(),
        "restartPolicy": "Always",
        "containers": [container(job, ctx, role=role)],
        "volumes": [{"name": names.CONFIG_VOLUME, "configMap": {"name": names.config_map(job.metadata.name)}},
                    *security.writable_volumes(), *checkpoint.pod_volumes(job, role),
                    *[dict(v) for v in spec.volumes]],
        **placement.pod_placement(job, role, avoid=ctx.avoid_nodes),
    }
    if shm_gib(spec):
        pod["volumes"].append(pods.shm_volume(shm_gib(spec)))
    if role == "trainer":       # room for the stop checkpoint (contract: STOP_CHECKPOINT_WITHIN_SECONDS)
        pod["terminationGracePeriodSeconds"] = contract.TRAINER_TERMINATION_GRACE_SECONDS
    scheduler = job.spec.gang.scheduler_name or gang.scheduler_name    # the job's own choice wins
    if scheduler:
        pod["schedulerName"] = scheduler
    if spec.priority_class_name:
        pod["priorityClassName"] = spec.priority_class_name
    pull = [s.name for s in spec.image_pull_secrets] or list(ctx.image_pull_secrets)   # the role's own list wins
    if pull:
        pod["imagePullSecrets"] = [{"name": n} for n in pull]
    return {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod}


def statefulset(job: rljob.RLJob, ctx: context.RenderContext, gang: base.GangParts, *, role: str) -> meta.Obj:
    """The StatefulSet ``<job>-<role>``: for generators, only the gang-held ones (``GeneratorRole.gang_held``)."""
    name = contract.child_name(job.metadata.name, role)
    want = base.minimums(job)[role] if role == "generator" else getattr(job.spec.roles, role).replicas
    replicas = want if ctx.active else 0
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta.metadata(job, ctx, name=name, labels={contract.LABEL_ROLE: role}),
        "spec": {
            "replicas": replicas,
            "serviceName": contract.service_name(job.metadata.name),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": meta.role_labels(job, role)},
            "template": pod_template(job, ctx, gang, role=role),
            **checkpoint.statefulset_fields(job, role),
        },
    }


def surplus_statefulset(job: rljob.RLJob, ctx: context.RenderContext, gang: base.GangParts) -> meta.Obj:
    """The StatefulSet ``<job>-gen-surplus`` of the generators beyond ``minReplicas``: ordinals start at the
    minimum (``spec.ordinals.start``), so generator indexes stay ``0..replicas-1`` across both StatefulSets; its
    pods carry no gang membership, and it has 0 replicas until ``ctx.surplus_active`` (the gang is placed), so a
    surplus generator never takes a gang member's place."""
    role, start = "generator", job.spec.roles.generator.gang_held()
    replicas = base.surplus(job) if ctx.active and ctx.surplus_active else 0
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta.metadata(job, ctx, name=contract.surplus_generators(job.metadata.name),
                                  labels={contract.LABEL_ROLE: role, names.LABEL_SURPLUS: "true"}),
        "spec": {
            "replicas": replicas,
            "ordinals": {"start": start},
            "serviceName": contract.service_name(job.metadata.name),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": {**meta.role_labels(job, role), names.LABEL_SURPLUS: "true"}},
            "template": pod_template(job, ctx, gang, role=role, surplus=True),
        },
    }


def surplus_ref(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """Just enough of the surplus StatefulSet to delete it."""
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": contract.surplus_generators(job.metadata.name), "namespace": ctx.namespace}}
