"""One idempotent pass for one GeneratorPool: observe → finalizer → render → apply → status (written once, if
changed).

Observe: the pool's engines ready, the RLJobs naming it (attached), the port block of each (``poolports``: kept from the
pool's ``status.jobPorts``), and which of them the engines serve (a block, neither suspended nor finished:
``poolstatus.held``). Keys: the pass derives the pool's key from the operator's master key (``kubeforge.api.poolkeys``;
the master is a file, never an API object) and creates the Secret holding it when absent; the engines derive each served
job's key from it and the jobs file. It reads no Secret (the operator's RBAC on Secrets is ``create``).

Role: the pool kind's ``reconcile`` (a second ``router.Router`` calls it from worker threads; ``handlers`` routes the
pool's events, its StatefulSet's and the attached jobs' creations and deletions to it). Neighbours: ``apply`` (the
API), ``render.pool`` and ``poolstatus`` (pure), ``reconcile.apply_all`` (the same two-wave server-side apply and
cache as a job's children).

Router keys of pools are ``(namespace, "generatorpools/<name>")`` (``key``), so they never meet a job's key (a pool and
a job may share a name) in the router or the metrics keyed by it.

Invariants: a deleted pool is never re-rendered (its children go with it by owner reference, once the finalizer
comes off); the finalizer comes off only when no RLJob of the namespace names the pool (``poolstatus.finalizers``),
so a deleted pool keeps serving its jobs until the last one is gone; a pass trusts no in-memory state (the cache
only skips re-creating a key Secret this process created); a key is written into a Secret only (never logged,
never into the status or a ConfigMap).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubeforge.api import contract, generatorpool, load, poolkeys
from kubeforge.operator import apply, poolports, poolstatus, reconcile
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Observed:
    """A pass's observation: the status facts and the members the engines serve."""

    facts: poolstatus.PoolFacts
    members: tuple[pool_render.Member, ...] = ()


def observe(cluster: apply.Cluster, raw: apply.Obj, namespace: str, name: str, *,
            keyed: bool = True) -> Observed:
    """The pool's engines ready (its StatefulSet's status), the jobs naming it and their port blocks, whether it is
    being deleted; a live pool's members too."""
    sts = cluster.get("apps/v1", "StatefulSet", namespace, contract.pool_service(name))
    ready = int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)
    bodies = cluster.list_rljobs(namespace)
    attached = poolstatus.attached_jobs(name, bodies)
    ports = poolports.assign(poolports.previous(raw.get("status")), attached)
    facts = poolstatus.PoolFacts(ready_engines=ready, attached=attached,
                                 deleting=bool(raw["metadata"].get("deletionTimestamp")), ports=tuple(ports.items()),
                                 keyed=keyed)
    if facts.deleting:
        return Observed(facts=facts)
    return Observed(facts=facts, members=pool_members(name, bodies, ports))


def pool_members(pool: str, bodies: Sequence[Mapping[str, Any]],
                 ports: Mapping[str, int]) -> tuple[pool_render.Member, ...]:
    """The attached jobs the engines serve: each with a port block, neither suspended nor finished
    (``poolstatus.held``: such a job keeps its block and leaves the jobs file, so the engines release its share and
    adapter slot; a finished one for good, a suspended one until it resumes),
    parsed, training an adapter (an engine refuses a jobs file with any other: one such job must not stop the pool
    serving the rest)."""
    out = []
    for body in sorted(bodies, key=lambda b: str(b["metadata"]["name"])):
        job_name = str(body["metadata"]["name"])
        if job_name not in ports or poolstatus.held(body):
            continue
        try:
            job = load.parse({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body})
        except load.InvalidRLJob as exc:
            log.error("GeneratorPool %s: attached RLJob %s is invalid, not served: %s", pool, job_name, exc)
            continue
        if job.spec.model.lora is None:
            log.error("GeneratorPool %s: attached RLJob %s trains no adapter (spec.model.lora), not served", pool,
                      job_name)
            continue
        out.append(pool_render.Member(job=job, uid=str(body["metadata"].get("uid") or ""),
                                      port_base=ports[job_name]))
    return tuple(out)


def reconcile_pool(cluster: apply.Cluster, k: Key, *, image: str, cache: reconcile.ApplyCache,
                   pool: concurrent.futures.Executor | None = None, image_pull_secrets: tuple[str, ...] = (),
                   master: bytes | None = None,
                   clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc)) -> reconcile.Outcome:
    """Bring the children, finalizer and status of the pool ``k`` (``key``) in line with its spec; ``master`` is
    the operator's pool master key (without it the engines are not rendered: condition ``NoMasterKey``)."""
    namespace, name = name_of(k)
    raw = cluster.get(contract.API_VERSION, contract.POOL_KIND, namespace, name)
    if raw is None:
        cache.forget(k)
        return reconcile.Outcome(gone=True)
    parsed = _parse(raw)
    if parsed is None:
        return reconcile.Outcome()
    seen = observe(cluster, raw, namespace, name, keyed=master is not None)
    facts = seen.facts
    wanted = poolstatus.finalizers(raw["metadata"].get("finalizers") or [], facts)
    if wanted is not None:
        written = cluster.patch_object(raw, {"metadata": {"finalizers": wanted,
                                                          "resourceVersion": raw["metadata"]["resourceVersion"]}})
        raw = written or raw
        if facts.deleting and not facts.attached:
            log.info("GeneratorPool %s/%s released: no RLJob names it", namespace, name)
            cache.forget(k)
            return reconcile.Outcome(gone=True)
    if not facts.deleting and master is not None:
        uid = str(raw["metadata"]["uid"])
        pool_key = poolkeys.pool_key(master, namespace=namespace, pool=name, uid=uid)
        ctx = pool_render.PoolContext(namespace=namespace, uid=uid, key_id=poolkeys.key_id(pool_key), image=image,
                                      image_pull_secrets=image_pull_secrets, attached=facts.attached,
                                      members=seen.members)
        secret = pool_render.key_secret(parsed, ctx, key_hex=pool_key.hex())
        if not cache.has_key_secret(k, secret["metadata"]["name"]):     # before the engines that mount it
            cluster.create_if_absent(secret)
            cache.key_secret_made(k, secret["metadata"]["name"])
        reconcile.apply_all(cluster, k, pool_render.render(parsed, ctx), cache=cache, pool=pool)
    elif not facts.deleting:
        log.error("GeneratorPool %s/%s: the operator has no pool master key (--pool-master-key-file): not rendered",
                  namespace, name)
    new = poolstatus.compute(parsed, facts, generation=raw["metadata"].get("generation"), now=clock())
    doc = new.model_dump(mode="json", by_alias=True)
    if parsed.status is None or doc != parsed.status.model_dump(mode="json", by_alias=True):
        cluster.patch_object_status(raw, {"status": doc})
    return reconcile.Outcome(requeue_after=DRAIN_POLL_S if facts.deleting and facts.attached else None)
