"""kopf handlers: they only route events to the router; all decisions live in ``reconcile``.

Watches: RLJobs; StatefulSets and pods carrying ``contract.LABEL_JOB`` (label-selected, so the operator never
caches unrelated objects); GeneratorPools and their StatefulSets (``contract.LABEL_POOL``), routed to the pools'
router (``poolreconcile``): a job's creation or deletion asks its pool for a pass (attached jobs, the finalizer),
and a pool's change asks its attached jobs for one (the engines they dial). A pod event that shows a failure hands
it to the router too, because the StatefulSet controller may replace a Failed pod before the next pass lists pods.
Kopf's bookkeeping stays out of ``status``: progress and diff-base storage are annotations, and only event
handlers are used, so kopf writes nothing to an RLJob and adds no finalizer.
"""
from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import kopf

from kubeforge.api import contract
from kubeforge.operator import (admission, apply, kubeconfig, metrics, observed, poolreconcile, poolstatus,
                                router as router_mod, watchcache)
from kubeforge.operator import webhook as webhook_mod

ANNOTATION_PREFIX = "kopf.kubeforge.dev"
IDLE_WORKER_S = 0.5


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf builds a diff base (a deep copy of the body) for every watch event, for change handlers; the operator
    has only event handlers, so nothing reads it: building none saves a deep copy per pod event."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings: annotation storages, no kopf event posting for routine logs, quick watch reconnects."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase(prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.posting.level = logging.ERROR
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.connect_timeout = 10
    # kopf keeps one worker per object with events, holding that object's last body until it has been idle this
    # long (5 s by default): at 1,000 jobs, thousands of parsed pod and StatefulSet bodies (tens of MiB) that no
    # handler needs once routed (the handlers copy what they keep into the watch caches).
    settings.queueing.idle_timeout = IDLE_WORKER_S


def build_registry(router: router_mod.Router, creds: apply.Credentials,
                   webhook: webhook_mod.Webhook | None = None, *, jobs: watchcache.JobCache | None = None,
                   pods: watchcache.PodCache | None = None,
                   runtime: admission.RuntimeImage | None = None,
                   pools: admission.PoolLookup | None = None,
                   pool_router: router_mod.Router | None = None) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers bound to ``router`` (and the admission webhook when given, reviewing
    against ``runtime``, the operator's runtime image, and the pools ``pools`` reads); the watch caches, when given,
    are fed from the same events. With ``pool_router``, GeneratorPools are reconciled too."""
    reg = kopf.OperatorRegistry()
    present = {contract.LABEL_JOB: kopf.PRESENT}
    pool_held: dict[tuple[str, str], bool] = {}    # a job on a pool: suspended or finished when its last event came

    @kopf.on.startup(registry=reg)
    def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        if webhook is not None:
            webhook_mod.configure(settings, webhook)

    if webhook is not None:
        @kopf.on.validate(contract.GROUP, contract.VERSION, contract.PLURAL, id=webhook_mod.HANDLER_ID,
                          operations=["CREATE", "UPDATE"], side_effects=False, registry=reg)
        def _admit(body: Any, **kw: Any) -> None:
            metrics.EVENTS.labels("admission").inc()
            old = kw.get("old")
            problems = admission.review(kw.get("operation") or "", dict(body), dict(old) if old else None,
                                        runtime=runtime, pools=pools, namespace=kw.get("namespace") or "")
            if problems:
                raise kopf.AdmissionError(admission.message(problems), code=422)

    handed: list[kubeconfig.Auth] = []

    @kopf.on.login(registry=reg)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        # kopf asks at start, when the credentials it has expire (``expiration``: when an exec plugin's are due)
        # and after a 401. Asked again while the ones it has are still current, they were refused: fresh ones
        # (plugin run again, token file re-read), or the same, which kopf then knows as refused and gives up.
        auth = creds.auth()
        if handed and auth == handed[0]:
            auth = creds.reauth(auth) or auth
        handed[:] = [auth]
        return kopf.ConnectionInfo(
            server=creds.server, ca_path=creds.ca_file, insecure=not creds.verify, scheme="Bearer" if auth.token
            else None, token=auth.token, certificate_path=auth.cert_file, private_key_path=auth.key_file,
            expiration=None if auth.refresh_at is None else dt.datetime.fromtimestamp(auth.refresh_at, dt.timezone.utc))

    @kopf.on.probe(id="reconciles", registry=reg)
    def _probe(**_: Any) -> float:
        return sum(s.value for m in metrics.RECONCILES.collect() for s in m.samples if s.name.endswith("_total"))

    @kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL, registry=reg)
    async def _rljob(**kw: Any) -> None:
        metrics.EVENTS.labels("rljob").inc()
        namespace, name = kw["namespace"], kw["name"]
        raw = kw["event"].get("object") or {}
        pool = ((raw.get("spec") or {}).get("generatorPool") or {}).get("name")
        if pool and pool_router is not None:
            # its pool's pass on its creation and deletion, and when it is suspended, resumes or finishes (the
            # engines serve no suspended or finished job: poolstatus.held); the last state seen is soft (a restart
            # asks once per job)
            held = poolstatus.held(raw)
            changed = pool_held.get((namespace, name)) != held
            if kw["event"].get("type") == "DELETED":
                pool_held.pop((namespace, name), None)
            else:
                pool_held[(namespace, name)] = held
            if changed or kw["event"].get("type") in (None, "ADDED", "DELETED"):
                pool_router.request(poolreconcile.key(namespace, pool), trigger="rljob")
        if kw["event"].get("type") == "DELETED":
            router.forget((namespace, name))
            for cache in (jobs, pods):
                if cache is not None:
                    cache.forget((namespace, name))
            return
        if jobs is not None:
            jobs.put(raw)
            if jobs.echo(raw):        # the operator's own status write coming back: nothing new to act on
                metrics.EVENTS.labels("rljob-echo").inc()
                return
        router.request((namespace, name), trigger="rljob")

    @kopf.on.event("apps", "v1", "statefulsets", labels=present, registry=reg)
    async def _statefulset(**kw: Any) -> None:
        # Status is computed from pods, so only a deleted StatefulSet needs a pass (to re-create it); its
        # frequent status updates would only cost passes that change nothing.
        metrics.EVENTS.labels("statefulset").inc()
        if kw["event"].get("type") == "DELETED":
            router.request((kw["namespace"], kw["labels"][contract.LABEL_JOB]), trigger="statefulset",
                           invalidate=True)

    @kopf.on.event("kueue.x-k8s.io", "v1beta2", "workloads", labels=present, registry=reg)
    async def _workload(**kw: Any) -> None:
        # Kueue admitted, evicted or requeued an RLJob's Workload (``queueing``); watched only where Kueue's CRDs
        # are installed (kopf watches a resource once the cluster serves it)
        metrics.EVENTS.labels("workload").inc()
        router.request((kw["namespace"], kw["labels"][contract.LABEL_JOB]), trigger="workload")

    @kopf.on.event("v1", "pods", labels=present, registry=reg)
    async def _pod(**kw: Any) -> None:
        metrics.EVENTS.labels("pod").inc()
        key = (kw["namespace"], kw["labels"][contract.LABEL_JOB])
        if pods is not None:
            pods.event(kw["event"].get("type"), kw["event"].get("object") or {})
        failure = observed.pod_failure(kw["body"])
        if failure is not None:
            router.note_failure(key, failure)
        router.request(key, trigger="pod")

    if pool_router is not None:
        _pool_handlers(reg, router, pool_router)
    return reg


def _pool_handlers(reg: kopf.OperatorRegistry, router: router_mod.Router, pool_router: router_mod.Router) -> None:
    @kopf.on.event(contract.GROUP, contract.VERSION, contract.POOL_PLURAL, registry=reg)
    async def _generatorpool(**kw: Any) -> None:
        metrics.EVENTS.labels("generatorpool").inc()
        namespace, name = kw["namespace"], kw["name"]
        if kw["event"].get("type") == "DELETED":
            pool_router.forget(poolreconcile.key(namespace, name))
        else:
            pool_router.request(poolreconcile.key(namespace, name), trigger="generatorpool")
        status = (kw["event"].get("object") or {}).get("status") or {}
        for job in status.get("attachedJobs") or ():    # the engines they dial may have changed
            router.request((namespace, job), trigger="generatorpool")

    @kopf.on.event("apps", "v1", "statefulsets", labels={contract.LABEL_POOL: kopf.PRESENT}, registry=reg)
    async def _pool_statefulset(**kw: Any) -> None:
        # its status carries the engines ready (status.readyEngines); deleted: the pass re-creates it
        metrics.EVENTS.labels("statefulset").inc()
        pool_router.request(poolreconcile.key(kw["namespace"], kw["labels"][contract.LABEL_POOL]),
                            trigger="statefulset", invalidate=kw["event"].get("type") == "DELETED")
