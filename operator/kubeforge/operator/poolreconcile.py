"""One idempotent pass for one GeneratorPool: observe → finalizer → render → apply → status (written once, if
changed).

Role: the pool kind's ``reconcile`` (a second ``router.Router`` calls it from worker threads; ``handlers`` routes the
pool's events, its StatefulSet's and the attached jobs' creations and deletions to it). Neighbours: ``apply`` (the
API), ``render.pool`` and ``poolstatus`` (pure), ``reconcile.apply_all`` (the same two-wave server-side apply and
cache as a job's children).

Router keys of pools are ``(namespace, "generatorpools/<name>")`` (``key``), so they never meet a job's key (a pool and
a job may share a name) in the router or the metrics keyed by it.

Invariants: a deleted pool is never re-rendered (its children go with it by owner reference, once the finalizer
comes off); the finalizer comes off only when no RLJob of the namespace names the pool (``poolstatus.finalizers``),
so a deleted pool keeps serving its jobs until the last one is gone; a pass trusts no in-memory state.
"""
from __future__ import annotations

import concurrent.futures
import datetime as dt
import logging
from collections.abc import Callable

from kubeforge.api import contract, generatorpool, load
from kubeforge.operator import apply, poolstatus, reconcile
from kubeforge.operator.render import pool as pool_render

log = logging.getLogger("kubeforge.operator")
Key = tuple[str, str]
PREFIX = f"{contract.POOL_PLURAL}/"
#: How soon a deleted pool that still has attached jobs is looked at again besides the jobs' deletion events.
DRAIN_POLL_S = 30.0


def key(namespace: str, name: str) -> Key:
    """The router key of pool ``name``."""
    return namespace, PREFIX + name


def name_of(k: Key) -> tuple[str, str]:
    """(namespace, pool name) of a router key made by :func:`key`."""
    return k[0], k[1].removeprefix(PREFIX)


def _parse(raw: apply.Obj) -> generatorpool.GeneratorPool | None:
    try:
        return load.parse_pool({k: raw[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in raw})
    except load.InvalidRLJob as exc:
        log.error("GeneratorPool %s/%s is invalid: %s", raw["metadata"].get("namespace"), raw["metadata"]["name"],
                  exc)
        return None


def observe(cluster: apply.Cluster, raw: apply.Obj, namespace: str, name: str) -> poolstatus.PoolFacts:
    """The pool's engines ready (its StatefulSet's status), the jobs naming it, whether it is being deleted."""
    sts = cluster.get("apps/v1", "StatefulSet", namespace, contract.pool_service(name))
    ready = int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)
    return poolstatus.PoolFacts(ready_engines=ready,
                                attached=poolstatus.attached_jobs(name, cluster.list_rljobs(namespace)),
                                deleting=bool(raw["metadata"].get("deletionTimestamp")))


def reconcile_pool(cluster: apply.Cluster, k: Key, *, image: str, cache: reconcile.ApplyCache,
                   pool: concurrent.futures.Executor | None = None, image_pull_secrets: tuple[str, ...] = (),
                   clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> reconcile.Outcome:
    """Bring the children, finalizer and status of the pool ``k`` (``key``) in line with its spec."""
    namespace, name = name_of(k)
    raw = cluster.get(contract.API_VERSION, contract.POOL_KIND, namespace, name)
    if raw is None:
        cache.forget(k)
        return reconcile.Outcome(gone=True)
    parsed = _parse(raw)
    if parsed is None:
        return reconcile.Outcome()
    facts = observe(cluster, raw, namespace, name)
    wanted = poolstatus.finalizers(raw["metadata"].get("finalizers") or [], facts)
    if wanted is not None:
        written = cluster.patch_object(raw, {"metadata": {"finalizers": wanted,
                                                          "resourceVersion": raw["metadata"]["resourceVersion"]}})
        raw = written or raw
        if facts.deleting and not facts.attached:
            log.info("GeneratorPool %s/%s released: no RLJob names it", namespace, name)
            cache.forget(k)
            return reconcile.Outcome(gone=True)
    if not facts.deleting:
        ctx = pool_render.PoolContext(namespace=namespace, uid=raw["metadata"]["uid"], image=image,
                                      image_pull_secrets=image_pull_secrets, attached=facts.attached)
        reconcile.apply_all(cluster, k, pool_render.render(parsed, ctx), cache=cache, pool=pool)
    new = poolstatus.compute(parsed, facts, generation=raw["metadata"].get("generation"), now=clock())
    doc = new.model_dump(mode="json", by_alias=True)
    if parsed.status is None or doc != parsed.status.model_dump(mode="json", by_alias=True):
        cluster.patch_object_status(raw, {"status": doc})
    return reconcile.Outcome(requeue_after=DRAIN_POLL_S if facts.deleting and facts.attached else None)
