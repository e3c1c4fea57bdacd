"""One idempotent pass for one GeneratorPool: observe → finalizer → render → apply → status (written once, if
changed).

Observe: the pool's engines ready, the RLJobs naming it (attached), the port block of each (``poolports``: kept from
the pool's ``status.jobPorts``), and for each attached job with a block its key (GET of its Secret ``<job>-key``, by
name: the engines serve a job only with its own key). A job whose key is not there yet (its own first pass creates
it) is attached but not yet served; the pass looks again after ``KEY_WAIT_S``.

Role: the pool kind's ``reconcile`` (a second ``router.Router`` calls it from worker threads; ``handlers`` routes the
pool's events, its StatefulSet's and the attached jobs' creations and deletions to it). Neighbours: ``apply`` (the
API), ``render.pool`` and ``poolstatus`` (pure), ``reconcile.apply_all`` (the same two-wave server-side apply and
cache as a job's children).

Router keys of pools are ``(namespace, "generatorpools/<name>")`` (``key``), so they never meet a job's key (a pool and
a job may share a name) in the router or the metrics keyed by it.

Invariants: a deleted pool is never re-rendered (its children go with it by owner reference, once the finalizer
comes off); the finalizer comes off only when no RLJob of the namespace names the pool (``poolstatus.finalizers``),
so a deleted pool keeps serving its jobs until the last one is gone; a pass trusts no in-memory state; a job's key
is written into the pool's keys Secret only (never logged, never into the status or a ConfigMap).
"""
from __future__ import annotations

import base64
import binascii
import concurrent.futures
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubeforge.api import contract, generatorpool, load, roleenv
from kubeforge.operator import apply, poolports, poolstatus, reconcile
from kubeforge.operator.render import pool as pool_render

log = logging.getLogger("kubeforge.operator")
Key = tuple[str, str]
PREFIX = f"{contract.POOL_PLURAL}/"
#: How soon a deleted pool that still has attached jobs is looked at again besides the jobs' deletion events.
DRAIN_POLL_S = 30.0
#: How soon a pass looks again when an attached job's key Secret is not there yet (its own pass creates it).
KEY_WAIT_S = 5.0


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
    """A pass's observation: the status facts, the members the engines serve, and whether an attached job with a
    port block has no usable key yet (``KEY_WAIT_S``)."""

    facts: poolstatus.PoolFacts
    members: tuple[pool_render.Member, ...] = ()
    keys_missing: bool = False


def observe(cluster: apply.Cluster, raw: apply.Obj, namespace: str, name: str) -> Observed:
    """The pool's engines ready (its StatefulSet's status), the jobs naming it and their port blocks, whether it is
    being deleted; a live pool's members too (their keys read)."""
    sts = cluster.get("apps/v1", "StatefulSet", namespace, contract.pool_service(name))
    ready = int(((sts or {}).get("status") or {}).get("readyReplicas") or 0)
    bodies = cluster.list_rljobs(namespace)
    attached = poolstatus.attached_jobs(name, bodies)
    ports = poolports.assign(poolports.previous(raw.get("status")), attached)
    facts = poolstatus.PoolFacts(ready_engines=ready, attached=attached,
                                 deleting=bool(raw["metadata"].get("deletionTimestamp")), ports=tuple(ports.items()))
    if facts.deleting:
        return Observed(facts=facts)
    keys = {job: key_hex(cluster.get("v1", "Secret", namespace, contract.job_key_secret(job))) for job in ports}
    members = pool_members(name, bodies, ports, keys)
    return Observed(facts=facts, members=members, keys_missing=any(v is None for v in keys.values()))


def key_hex(secret: Mapping[str, Any] | None) -> str | None:
    """The job key a job's Secret holds, as hex (None: absent or not a key of ``roleenv.JOB_KEY_MIN_BYTES``)."""
    raw = ((secret or {}).get("data") or {}).get(contract.JOB_KEY_SECRET_KEY)
    try:
        text = base64.b64decode(raw, validate=True).decode() if isinstance(raw, str) else ""
        key = bytes.fromhex(text)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return key.hex() if len(key) >= roleenv.JOB_KEY_MIN_BYTES else None


def pool_members(pool: str, bodies: Sequence[Mapping[str, Any]], ports: Mapping[str, int],
                 keys: Mapping[str, str | None]) -> tuple[pool_render.Member, ...]:
    """The attached jobs the engines serve: each with a port block and a key, parsed, training an adapter (an
    engine refuses a jobs file with any other: one such job must not stop the pool serving the rest)."""
    out = []
    for body in sorted(bodies, key=lambda b: str(b["metadata"]["name"])):
        job_name = str(body["metadata"]["name"])
        key = keys.get(job_name)
        if job_name not in ports or key is None:
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
        out.append(pool_render.Member(job=job, port_base=ports[job_name], key_hex=key))
    return tuple(out)


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
    seen = observe(cluster, raw, namespace, name)
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
    if not facts.deleting:
        ctx = pool_render.PoolContext(namespace=namespace, uid=raw["metadata"]["uid"], image=image,
                                      image_pull_secrets=image_pull_secrets, attached=facts.attached,
                                      members=seen.members)
        reconcile.apply_all(cluster, k, pool_render.render(parsed, ctx), cache=cache, pool=pool)
    new = poolstatus.compute(parsed, facts, generation=raw["metadata"].get("generation"), now=clock())
    doc = new.model_dump(mode="json", by_alias=True)
    if parsed.status is None or doc != parsed.status.model_dump(mode="json", by_alias=True):
        cluster.patch_object_status(raw, {"status": doc})
    return reconcile.Outcome(requeue_after=DRAIN_POLL_S if facts.deleting and facts.attached else
                             KEY_WAIT_S if seen.keys_missing else None)
