"""One idempotent reconcile pass for one RLJob: observe → decide → render → apply → status → write once → events.

Role: the single function every event routes to (``router`` calls it from a worker thread). Neighbours: ``apply``
(the API), ``observed``/``lifecycle``/``render``/``status`` (pure). Invariants:
- replaying a pass is harmless: child names are deterministic and server-side apply is declarative;
- the status is written at most once per pass, and only when it changed; events go out after that write; a change
  of detail only (counts, messages: ``status.substance`` equal) waits until ``StatusPacer``'s interval after the
  job's last write, and the pass asks to run again then, so the detail is late by at most that interval, never lost;
- a pass never trusts in-memory state for correctness: the ``ApplyCache`` only skips re-sending an object this
  process already applied unchanged (it is dropped when a child is deleted, and expires), so a restarted
  operator re-applies everything once.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from kubeforge.api import contract, failures, load, poolkeys, rljob
from kubeforge.operator import (apply, exports, fencing, gangauto, lifecycle, metrics, names, nodeloss, observed,
                                peersilence, poolports, queueing, reasons, render, status, timefmt, trainersilence,
                                watchcache)
from kubeforge.operator.render import agent, context, gang, meta, sandbox, secret
from kubeforge.operator.render import workload as workload_render

log = logging.getLogger("kubeforge.operator")
Key = tuple[str, str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a pass did, for the router (requeue) and the metrics."""

    gone: bool = False                   # the RLJob no longer exists (or was deleted by its TTL)
    phase: str | None = None
    previous_phase: str | None = None
    requeue_after: float | None = None
    created: str | None = None           # the RLJob's creationTimestamp
    decision: failures.Decision | None = None   # what the failure policy decided this pass
    all_ready: bool = False              # every role of the current attempt has all replicas ready
    fenced: dict[str, int] = dataclasses.field(default_factory=dict)   # what status.fencedWrites gained, by kind


class ApplyCache:
    """Digests of objects this process applied, per job, so unchanged objects are not re-sent every pass."""

    def __init__(self, *, max_age: float = 600.0) -> None:
        self._max_age = max_age
        self._lock = threading.Lock()
        self._seen: dict[Key, dict[tuple[str, str, str, str], tuple[str, float]]] = {}
        self._keyed: set[tuple[Key, str]] = set()   # (job or pool, Secret) key Secrets this process made sure of
        self._done: dict[Key, tuple[Any, float]] = {}   # job -> (render key, when) of its last complete apply

    @staticmethod
    def digest(obj: meta.Obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()

    def fresh(self, job: Key, obj: meta.Obj) -> bool:
        with self._lock:
            hit = self._seen.get(job, {}).get(meta.key(obj))
        return hit is not None and hit[0] == self.digest(obj) and time.monotonic() - hit[1] < self._max_age

    def remember(self, job: Key, obj: meta.Obj) -> None:
        with self._lock:
            self._seen.setdefault(job, {})[meta.key(obj)] = (self.digest(obj), time.monotonic())

    def drop(self, job: Key, obj: meta.Obj) -> None:
        """``obj`` was deleted: the next pass that wants it must send it again."""
        with self._lock:
            self._seen.get(job, {}).pop(meta.key(obj), None)
            self._done.pop(job, None)

    def forget(self, job: Key) -> None:
        with self._lock:
            self._seen.pop(job, None)
            self._keyed = {k for k in self._keyed if k[0] != job}
            self._done.pop(job, None)

    def unchanged(self, job: Key, render_key: Any) -> bool:
        """Every child rendered from ``render_key`` was applied (and every absent one deleted) by this process
        less than ``max_age`` ago: the pass can skip rendering and applying altogether."""
        with self._lock:
            hit = self._done.get(job)
        return render_key is not None and hit is not None and hit[0] == render_key and \
            time.monotonic() - hit[1] < self._max_age

    def applied(self, job: Key, render_key: Any) -> None:
        with self._lock:
            self._done[job] = (render_key, time.monotonic())

    def has_key_secret(self, job: Key, name: str) -> bool:
        with self._lock:
            return (job, name) in self._keyed

    def key_secret_made(self, job: Key, name: str) -> None:
        with self._lock:
            self._keyed.add((job, name))


class StatusPacer:
    """When each job's status was last written by this process, so that writes changing detail only (a pod more
    ready, a count in a message) are paced per job: each such write is a full status-subresource update, a watch
    event to every RLJob watcher and an etcd write, and without pacing a job of 10 pods costs one per pod scheduled
    and one per pod ready. The first detail write after a write of substance waits ``interval``; each further one
    in a row waits twice as long as the one before, up to ``max_interval`` (a gang that takes a minute to form on a
    loaded control plane changes its messages all along: at a fixed 5 s that was a write every 5 s per job). Soft
    state: a restarted operator writes at once."""

    def __init__(self, *, interval: float = 5.0, max_interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._max = max(interval, max_interval if max_interval is not None else 6 * interval)
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Key, tuple[float, float]] = {}   # job -> (when last written, wait for the next detail)

    def wait(self, job: Key) -> float:
        """Seconds until a detail-only write of ``job`` is due (0: now)."""
        with self._lock:
            last = self._last.get(job)
        return 0.0 if last is None else max(0.0, last[0] + last[1] - self._clock())

    def wrote(self, job: Key, *, detail: bool = False) -> None:
        """A write of ``job`` went out: of detail only (the next detail waits longer) or of substance."""
        with self._lock:
            prev = self._last.get(job)
            step = min(prev[1] * 2, self._max) if detail and prev is not None else self._interval
            self._last[job] = (self._clock(), step)

    def forget(self, job: Key) -> None:
        with self._lock:
            self._last.pop(job, None)


def _status_doc(s: rljob.RLJobStatus | None) -> dict[str, Any] | None:
    return None if s is None else s.model_dump(mode="json", by_alias=True)


def _parse(raw: meta.Obj) -> rljob.RLJob | None:
    try:
        return load.parse({k: raw[k] for k in ("apiVersion", "kind", "metadata", "spec", "status") if k in raw})
    except load.InvalidRLJob as exc:
        log.error("RLJob %s/%s is invalid: %s", raw["metadata"].get("namespace"), raw["metadata"]["name"], exc)
        return None


#: The API server's refusal of a change to a StatefulSet field that cannot change (e.g. ``serviceName`` of a job
#: made by an operator that gave each role its own Service): the StatefulSet must be re-created.
IMMUTABLE_STS = "Forbidden: updates to statefulset spec for fields other than"


def _apply_one(cluster: apply.Cluster, obj: meta.Obj) -> None:
    """Server-side apply ``obj``; a StatefulSet whose immutable fields changed is deleted with its pods orphaned
    (they keep running and the re-created StatefulSet adopts them: same selector, ``OnDelete``) and the refusal
    is raised as a conflict, so the router retries the pass and re-creates it."""
    try:
        cluster.apply(obj)
    except apply.ApiError as exc:
        if obj["kind"] != "StatefulSet" or exc.status != 422 or IMMUTABLE_STS not in str(exc):
            raise
        log.warning("re-creating StatefulSet %s/%s (immutable fields changed), its pods orphaned meanwhile",
                    obj["metadata"]["namespace"], obj["metadata"]["name"])
        cluster.delete(obj, propagation="Orphan")
        raise apply.ApiError(409, "PATCH", obj["metadata"]["name"], "re-created: immutable fields changed") \
            from exc


def apply_all(cluster: apply.Cluster, key: Key, objs: Iterable[meta.Obj], *, cache: ApplyCache,
              pool: concurrent.futures.Executor | None = None) -> None:
    """Server-side apply every object not already applied unchanged, in two waves: what pods need first
    (config, identity, Services, the gang object), then the StatefulSets that create pods. Objects of a wave go
    out concurrently when a ``pool`` is given (one pass is mostly waiting on the API server)."""
    todo = [o for o in objs if not cache.fresh(key, o)]
    for wave in ([o for o in todo if o["kind"] != "StatefulSet"], [o for o in todo if o["kind"] == "StatefulSet"]):
        if pool is None or len(wave) < 2:
            for obj in wave:
                _apply_one(cluster, obj)
        else:
            list(pool.map(lambda o: _apply_one(cluster, o), wave))
        for obj in wave:
            cache.remember(key, obj)


def _read_job(cluster: apply.Cluster, key: Key, jobs: watchcache.JobCache | None) -> meta.Obj | None:
    raw = jobs.get(key) if jobs is not None else None
    if raw is None:
        raw = cluster.get_rljob(*key)
        if raw is not None and jobs is not None:
            jobs.put(raw)
    return raw


def _read_pods(cluster: apply.Cluster, key: Key, pods: watchcache.PodCache | None) -> list[observed.PodFacts]:
    if pods is None:
        return [observed.pod_facts(p) for p in cluster.list_pods(*key)]
    facts = pods.pods(key)
    if facts is None:
        try:
            items, rv = cluster.list_pods_at(*key, not_older_than=pods.newest())
        except Exception as exc:   # noqa: BLE001 - any failure of the re-LIST (API error, timeout)
            stale = pods.stale(key)
            if stale is None:
                raise                      # never listed: the pass cannot know the job's pods
            metrics.POD_RELIST_FAILED.inc()
            log.info("re-list of the pods of %s/%s failed (%s); this pass uses the watch-fed pods", *key,
                     type(exc).__name__)
            return stale
        pods.merge_list(key, items, rv)
        facts = pods.pods(key) or []
    return facts


#: How soon a job Kueue has not admitted (or has evicted) is looked at again besides its Workload's watch events.
QUEUE_POLL_S = 10.0
TEMPLATE_WAIT_S = 1.0     # a lost trainer pod waits this long between looks at its StatefulSet (_held_trainers)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Queue:
    """What a pass read of a Kueue workload: its Workload, the assigned flavors, the priority (or why invalid)."""

    wl: queueing.WorkloadFacts
    raw: meta.Obj | None
    flavors: dict[str, queueing.Flavor]
    priority: int | None
    invalid: str | None
    grows: dict[int, tuple[queueing.WorkloadFacts, meta.Obj]] = dataclasses.field(default_factory=dict)

    def growth(self, job: rljob.RLJob, obs: observed.Observed, *, over: bool) -> queueing.Growth:
        live = tuple(p.index for p in obs.pods if p.role == "generator" and p.index is not None and not p.terminating)
        return queueing.growth(job, self.wl, {i: f for i, (f, _) in self.grows.items()}, over=over,
                               live_generators=live)


def _read_grows(cluster: apply.Cluster, job: rljob.RLJob,
                namespace: str) -> dict[int, tuple[queueing.WorkloadFacts, meta.Obj]]:
    """The job's grow Workloads by ordinal (one LIST; only for a job Kueue may admit partially)."""
    if not queueing.grow_candidates(job):
        return {}
    by_name = {names.grow_workload(job.metadata.name, i): i for i in queueing.grow_candidates(job)}
    kind = {"apiVersion": queueing.API_VERSION, "kind": "Workload"}     # a LIST's items may leave them out
    return {by_name[o["metadata"]["name"]]: (queueing.facts(o), {**o, **kind})
            for o in cluster.list_of_job(queueing.API_VERSION, "Workload", namespace, job.metadata.name)
            if o["metadata"]["name"] in by_name}


def _read_queue(cluster: apply.Cluster, job: rljob.RLJob, namespace: str) -> Queue:
    raw = cluster.get(queueing.API_VERSION, "Workload", namespace, job.metadata.name)
    wl = queueing.facts(raw)
    priority, invalid = None, None
    pc = queueing.priority_class(job)
    if pc is not None:
        got = cluster.get_kueue("workloadpriorityclasses", pc)
        if got is None:
            invalid = (f"metadata.labels[{contract.LABEL_KUEUE_PRIORITY}]: WorkloadPriorityClass {pc!r} does not "
                       "exist (kubectl get workloadpriorityclasses)")
        else:
            priority = int(got.get("value", 0))
    flavors: dict[str, queueing.Flavor] = {}
    if wl.admitted:
        for name in sorted({f for a in wl.assigned.values() for f in a.flavors}):
            fl = cluster.get_kueue("resourceflavors", name)
            flavors[name] = queueing.flavor(fl) if fl is not None else queueing.Flavor()
    grows = _read_grows(cluster, job, namespace) if wl.exists else {}
    return Queue(wl=wl, raw=raw, flavors=flavors, priority=priority, invalid=invalid, grows=grows)


def _sync_workload(cluster: apply.Cluster, key: Key, job: rljob.RLJob, ctx: context.RenderContext, q: Queue,
                   plan: lifecycle.Plan, obs: observed.Observed, *, cache: ApplyCache, now: dt.datetime) -> None:
    """What the integration owes Kueue this pass: the Workload (while the job is not over), its quota given back
    once an evicted job has no pod left, and Finished once the job is over; the grow Workloads (``growth``)."""
    stamp = timefmt.fmt(now)
    if plan.terminal is None and q.invalid is None:
        wl = workload_render.workload(job, ctx, priority=q.priority)
        if not cache.fresh(key, wl):
            cluster.apply(wl)
            cache.remember(key, wl)
    if q.raw is None:
        return
    grow = q.growth(job, obs, over=plan.terminal is not None or q.invalid is not None)
    gen = q.wl.assigned.get("generator")
    labels = {k: v for name in (gen.flavors if gen else ()) for k, v in q.flavors.get(
        name, queueing.Flavor()).node_labels.items()}
    for i in grow.create:
        gw = workload_render.grow_workload(job, ctx, i, priority=q.priority, node_labels=labels)
        if not cache.fresh(key, gw):
            cluster.apply(gw)
            cache.remember(key, gw)
    for i in grow.release:
        f, raw_grow = q.grows[i]
        released = queueing.release(f, now=stamp)
        if released is not None:
            cluster.patch_object_status(raw_grow, released)
    for i in grow.delete:
        gone = q.grows[i][1]
        cluster.delete(gone)
        cache.drop(key, gone)
    patch = None
    if plan.terminal is not None:
        patch = queueing.finish(q.wl, succeeded=plan.terminal == rljob.Phase.SUCCEEDED.value,
                                message=plan.terminal_message, now=stamp)
    elif q.wl.evicted is not None and not any(not p.terminating for p in obs.pods):
        patch = queueing.release(q.wl, now=stamp)
    if patch is not None:
        cluster.patch_object_status(q.raw, patch)


def _serves_podgroups(cluster: apply.Cluster) -> bool:
    """Does the API server serve PodGroups (API discovery of ``gangauto.PODGROUP_API``; a 404: no)?"""
    return gangauto.PODGROUP_RESOURCE in cluster.served_resources(gangauto.PODGROUP_API)


def _gang_choice(cluster: apply.Cluster, job: rljob.RLJob, *, coscheduling_scheduler: str) -> gangauto.Choice | None:
    """What ``gang.backend: Auto`` renders for ``job``: the choice kept in its status, else one made now from the
    facts (one discovery GET, once per job, when the queue label does not decide). None: not Auto."""
    if not gangauto.is_auto(job):
        return None
    kept = gangauto.kept(job)
    if kept is not None:
        return kept
    served = queueing.queue_name(job) is None and _serves_podgroups(cluster)
    return gangauto.choose(job, podgroups_served=served, coscheduling_scheduler=coscheduling_scheduler)


def _write_status(cluster: apply.Cluster, key: Key, doc: dict[str, Any], jobs: watchcache.JobCache | None) -> None:
    written = cluster.patch_status(*key, doc)
    if written and jobs is not None:
        jobs.put(written, own=True)


def reconcile(cluster: apply.Cluster, key: Key, *, image: str, cache: ApplyCache,
              pool: concurrent.futures.Executor | None = None, seen_failures: Iterable[observed.Failure] = (),
              clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
              jobs: watchcache.JobCache | None = None, pods: watchcache.PodCache | None = None,
              pacer: StatusPacer | None = None, node_loss_grace: float = nodeloss.GRACE_S,
              coscheduling_scheduler: str = "", image_pull_secrets: tuple[str, ...] = (),
              pool_master: bytes | None = None) -> Outcome:
    """Bring the children and the status of RLJob ``key`` (namespace, name) in line with its spec. With the watch
    caches (``jobs``, ``pods``) the pass reads the RLJob and its pods from them instead of GET and LIST; with a
    ``pacer``, status writes of detail only are paced per job. ``coscheduling_scheduler`` and
    ``image_pull_secrets`` are the operator's settings (``RenderContext``); ``pool_master`` its pool master key
    (``poolkeys``: a job on a GeneratorPool gets its key derived from it; without it such a job gets no pods)."""
    namespace, name = key
    raw = _read_job(cluster, key, jobs)
    if raw is None or raw["metadata"].get("deletionTimestamp"):
        cache.forget(key)
        if pacer is not None:
            pacer.forget(key)
        return Outcome(gone=True)
    job = _parse(raw)
    if job is None:
        cluster.post_event(raw, type="Warning", reason=reasons.INVALID_SPEC, now=timefmt.fmt(clock()),
                           message="the RLJob does not match the kubeforge API model; see the operator log")
        return Outcome()
    now = clock()
    obs = observed.observe_facts(_read_pods(cluster, key, pods), seen_failures)
    lost = _node_loss(cluster, obs, now=now, grace=node_loss_grace)
    silence = _peer_silence(cluster, job, obs, now=now, known=lost)
    quiet = _trainer_silence(cluster, job, obs, now=now,
                             known=nodeloss.Verdict(lost=lost.lost + silence.lost))
    silence = nodeloss.Verdict(lost=silence.lost + quiet.verdict.lost,
                               requeue_after=_min(silence.requeue_after, quiet.verdict.requeue_after))
    avoid = _avoided(cluster, job, nodeloss.Verdict(lost=lost.lost + silence.lost))
    left = peersilence.left_on(avoid, obs.pods, taken={p.pod for p in (*lost.lost, *silence.lost)}, now=now)
    lost = nodeloss.Verdict(lost=lost.lost + silence.lost + left,
                            requeue_after=_min(lost.requeue_after, silence.requeue_after))
    if lost.lost:     # each lost pod is a failure of its role (reason NodeLost): the failure policy acts on it
        obs = dataclasses.replace(obs, seen_failures=obs.seen_failures + tuple(p.failure for p in lost.lost))
    queue = _read_queue(cluster, job, namespace) if queueing.queue_name(job) is not None else None
    grown = queue.growth(job, obs, over=False).grown if queue is not None else 0
    gate = queueing.gate(queue.wl, invalid=queue.invalid, grown=grown) if queue is not None else None
    plan = lifecycle.decide(job, obs, now=now, queue=gate)
    if plan.delete_job:
        log.info("deleting %s/%s: ttlSecondsAfterFinished expired", namespace, name)
        cluster.delete_rljob(namespace, name)
        cache.forget(key)
        if pacer is not None:
            pacer.forget(key)
        return Outcome(gone=True, phase=job.status.phase if job.status else None)
    choice = _gang_choice(cluster, job, coscheduling_scheduler=coscheduling_scheduler)
    pool_raw, engines, port_base = _pool_engines(cluster, job, namespace)
    job_key = _job_key(job, raw, pool_raw, namespace=namespace, master=pool_master)
    if job.spec.generator_pool is not None and job_key is None:
        engines = None
    held = engines is None and plan.active   # no GeneratorPool, no port block or no key on it yet: no pods until then
    if held and job.spec.generator_pool is not None and pool_raw is None:
        cluster.post_event(raw, type="Warning", reason=reasons.POOL_NOT_FOUND, now=timefmt.fmt(now),
                           message=f"GeneratorPool {job.spec.generator_pool.name!r} does not exist in namespace "
                           f"{namespace}: the job's pods wait for it")
    elif held and pool_raw is not None and job_key is None:
        log.error("%s/%s: the operator has no pool master key (--pool-master-key-file): a job on GeneratorPool %r "
                  "gets no pods", namespace, name, pool_raw["metadata"]["name"])
    ctx = context.RenderContext(namespace=namespace, uid=raw["metadata"]["uid"], attempt=plan.attempt,
                                trainer_epoch=plan.trainer_epoch, avoid_nodes=avoid,
                                active=plan.active and not held, gang_active=plan.gang_active and not held,
                                pool_engines=engines or 0, pool_port_base=port_base, image=image,
                                surplus_active=plan.surplus_active, surplus_present=plan.surplus_present,
                                admission=queueing.admission_key(queue.wl, queue.flavors, grown=grown)
                                if queue is not None and gate is not None and gate.admitted else "",
                                gang_backend=choice.backend if choice is not None else "",
                                coscheduling_scheduler=coscheduling_scheduler,
                                image_pull_secrets=image_pull_secrets,
                                key_secret=names.pool_job_key_secret(name, poolkeys.key_id(job_key))
                                if job_key is not None else "")
    if queue is not None:
        _sync_workload(cluster, key, job, ctx, queue, plan, obs, cache=cache, now=now)
    shape = queueing.admitted_job(job, queue.wl, queue.flavors, grown=grown) \
        if ctx.admission and queue is not None else job
    # the job key, created only when absent (render/secret.py): drawn once for a job with generators of its own,
    # derived from its pool's key for a job on a GeneratorPool (under a name its fingerprint is part of), not made
    # at all while such a job has no pool to derive it from
    wanted_secret = ctx.key_secret or contract.job_key_secret(name)
    if (job.spec.generator_pool is None or job_key is not None) and not cache.has_key_secret(key, wanted_secret):
        cluster.create_if_absent(secret.job_key_secret(
            job, ctx, key_hex=job_key.hex() if job_key is not None else secrets.token_hex(32)))
        if job.spec.agent is not None:   # the agent pods' key, drawn apart from the job key (render/agent.py)
            cluster.create_if_absent(agent.agent_key_secret(job, ctx, key_hex=secrets.token_hex(32)))
        cache.key_secret_made(key, wanted_secret)
    sandbox_secret = contract.sandbox_key_secret(name)
    if job.spec.sandbox is not None and not cache.has_key_secret(key, sandbox_secret):
        # the sandbox pods' key, drawn apart from the job key (render/sandbox.py); checked on its own, so a pool
        # added to a running job gets its key too
        cluster.create_if_absent(sandbox.key_secret(job, ctx, key_hex=secrets.token_hex(32)))
        cache.key_secret_made(key, sandbox_secret)
    # The children are a function of the spec (its generation), the job's identity and the context alone (the
    # renderers read no status), so a pass whose render key matches the last complete apply skips both steps.
    generation = raw["metadata"].get("generation")
    render_key = (generation, ctx) if generation is not None else None
    if not cache.unchanged(key, render_key):
        _apply_children(cluster, key, shape, ctx, raw, now=now, cache=cache, pool=pool, jobs=jobs)
        cache.applied(key, render_key)
    new = status.compute(shape, obs, plan, generation=raw["metadata"].get("generation"), now=now, gang_choice=choice)
    requeue = _min(plan.requeue_after, lost.requeue_after)
    if gate is not None and not gate.admitted and plan.terminal is None:
        requeue = _min(requeue, QUEUE_POLL_S)
    if _status_doc(new) != _status_doc(job.status):
        detail = pacer is not None and status.substance(new) == status.substance(job.status)
        wait = pacer.wait(key) if pacer is not None and detail else 0.0
        if wait > 0:             # detail only, and written lately: the pass runs again when the write is due
            metrics.STATUS_DEFERRED.inc()
            requeue = wait if requeue is None else min(requeue, wait)
        else:
            _write_status(cluster, key, _status_doc(new) or {}, jobs)
            if pacer is not None:
                pacer.wrote(key, detail=detail)
    for ev in status.transitions(job.status, new, plan):
        cluster.post_event(raw, type=ev.type, reason=ev.reason, message=ev.message, now=timefmt.fmt(now))
    # after the status write that records the failures as handled: a pass that dies in between acts on them again
    heard, still = {p.pod for p in silence.lost}, {p.pod for p in left}
    for node in lost.nodes:
        on = {p.pod for p in lost.lost if p.node == node}
        text = trainersilence.message(lost, node, witness=quiet.witnesses[node], quiet_s=quiet.quiet_s) \
            if node in quiet.witnesses else \
            peersilence.message(lost, node, job.spec.failure_policy.peer_silence_seconds) if on & heard else \
            peersilence.left_message(lost, node) if on <= still else nodeloss.message(lost, node, node_loss_grace)
        log.warning("%s/%s: %s", namespace, name, text)
        cluster.post_event(raw, type="Warning", reason=reasons.NODE_LOST, now=timefmt.fmt(now), message=text)
    held_pods = _held_trainers(cluster, key, lost, trainer_epoch=plan.trainer_epoch) | \
        _held_replacements(cluster, key, silence)
    for p in lost.lost:
        if p.pod not in held_pods:
            cluster.force_delete_pod(namespace, p.pod, p.uid)
    if held_pods:          # the next pass deletes them (they are still lost), once the template is observed
        requeue = _min(requeue, TEMPLATE_WAIT_S)
    handoff = exports.relay(job, obs, attempt=plan.attempt, served=new.progress.last_export,
                            annotations=raw["metadata"].get("annotations")) if plan.active else None
    if handoff is not None:      # the user's export request on the RLJob, for trainer 0 (exports.py)
        cluster.patch_pod(namespace, handoff.pod, handoff.patch())
    ready = next((c.status == "True" for c in new.conditions if c.type == reasons.READY), False)
    return Outcome(phase=new.phase, previous_phase=job.status.phase if job.status else None,
                   requeue_after=requeue, created=raw["metadata"].get("creationTimestamp"),
                   decision=plan.decision, all_ready=ready,
                   fenced=fencing.gained(job.status.fenced_writes if job.status else None, new.fenced_writes))


def _pool_engines(cluster: apply.Cluster, job: rljob.RLJob,
                  namespace: str) -> tuple[meta.Obj | None, int | None, int]:
    """The GeneratorPool ``job`` names (its body; None: it does not exist), its engines (its ``spec.replicas``; 0
    for a job with generators of its own; None: the job gets no pods yet) and the port base the engines serve the
    job at (``poolports``: the pool's ``status.jobPorts``). A job gets no pods while its pool does not exist
    (``reasons.POOL_NOT_FOUND``) or has given it no port block yet (its pass, on the job's creation, gives one; the
    status write that records it asks for this job's pass: ``handlers``). A pool's creation, replica change or new
    port block reaches its jobs by a pass the pool's events ask for."""
    ref = job.spec.generator_pool
    if ref is None:
        return None, 0, contract.DEFAULT_PORT_BASE
    raw = cluster.get(contract.API_VERSION, contract.POOL_KIND, namespace, ref.name)
    if raw is None:
        return None, None, contract.DEFAULT_PORT_BASE
    base = poolports.port_base_of(raw, job.metadata.name)
    if base is None:
        return raw, None, contract.DEFAULT_PORT_BASE
    return raw, int((raw.get("spec") or {}).get("replicas") or 0), base


def _job_key(job: rljob.RLJob, raw: meta.Obj, pool_raw: meta.Obj | None, *, namespace: str,
             master: bytes | None) -> bytes | None:
    """The key of a job on a GeneratorPool, derived from its pool's (``poolkeys``); None for a job with generators
    of its own, or while its pool does not exist or the operator has no master key."""
    if job.spec.generator_pool is None or pool_raw is None or master is None:
        return None
    pool_key = poolkeys.pool_key(master, namespace=namespace, pool=pool_raw["metadata"]["name"],
                                 uid=str(pool_raw["metadata"].get("uid") or ""))
    return poolkeys.job_key(pool_key, namespace=namespace, job=job.metadata.name,
                            uid=str(raw["metadata"].get("uid") or ""))


def _min(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def _held_trainers(cluster: apply.Cluster, key: Key, lost: nodeloss.Verdict, *,
                   trainer_epoch: int) -> set[str]:
    """Lost trainer pods not to force-delete yet: the StatefulSet controller has not observed the template with
    ``trainer_epoch``, so their replacements could still carry the epoch of the pods they replace
    (``fencing.template_observed``; docs/fencing.md)."""
    trainers = {p.pod for p in lost.lost if p.failure.role == "trainer"}
    if not trainers:
        return set()
    sts = cluster.get("apps/v1", "StatefulSet", key[0], contract.child_name(key[1], "trainer"))
    return set() if fencing.template_observed(sts, trainer_epoch=trainer_epoch) else trainers


def _held_replacements(cluster: apply.Cluster, key: Key, silence: nodeloss.Verdict) -> set[str]:
    """Pods lost by silence not to force-delete yet: their StatefulSet has not observed its latest template (the one
    that keeps replacements off the node that does not answer: ``peersilence.avoided``)."""
    held: set[str] = set()
    for sts_name in sorted({p.pod.rsplit("-", 1)[0] for p in silence.lost}):
        sts = cluster.get("apps/v1", "StatefulSet", key[0], sts_name)
        if not fencing.generation_observed(sts):
            held |= {p.pod for p in silence.lost if p.pod.rsplit("-", 1)[0] == sts_name}
    return held


def _lease(cluster: apply.Cluster, node: str) -> peersilence.Kubelet | None:
    """The node's kubelet Lease, when the operator may read it (None: absent or refused: docs/recovery.md)."""
    try:
        return peersilence.kubelet(cluster.get_node_lease(node))
    except apply.ApiError as exc:
        if exc.status in (401, 403):
            return None
        raise


def _peer_silence(cluster: apply.Cluster, job: rljob.RLJob, obs: observed.Observed, *, now: dt.datetime,
                  known: nodeloss.Verdict) -> nodeloss.Verdict:
    """The job's pods lost by the silence trainer 0 reports (``peersilence``): reads the Node and the Lease of each
    silent generator's node, nothing when none is silent; pods ``known`` lost already are not judged again."""
    rank0 = names.pod(job.metadata.name, "trainer", 0)     # of any attempt: the pods it names started before
    report = next((fencing.screen(p)[0] for p in obs.pods if p.name == rank0 and p.progress is not None), None)
    taken = {p.pod for p in known.lost}
    silent = [s for s in peersilence.silent_pods(report, obs.pods) if s.pod.name not in taken]
    if not silent:
        return nodeloss.Verdict()
    names_ = sorted({s.pod.node or "" for s in silent})
    nodes = {n: nodeloss.node_facts(cluster.get_node(n), n) for n in names_}
    leases = {n: _lease(cluster, n) for n in names_}
    return peersilence.judge(silent, [p for p in obs.pods if p.name not in taken], nodes, leases, now=now,
                             peer_silence=float(job.spec.failure_policy.peer_silence_seconds))


def _trainer_silence(cluster: apply.Cluster, job: rljob.RLJob, obs: observed.Observed, *, now: dt.datetime,
                     known: nodeloss.Verdict) -> trainersilence.Judged:
    """The job's pods lost with a trainer's node that does not answer (``trainersilence``): reads the Nodes and
    Leases of the trainers' nodes only once trainer 0's progress has been quiet for ``peerSilenceSeconds``, and the
    Leases of the job's other nodes only when a trainer node's renewal is overdue; pods ``known`` lost already are
    not judged again."""
    st = job.status
    # not gated on phase Running: the pass that first writes Running reads the status before it (Starting), and a
    # trainer silent from then on makes no event for another pass (2026-11-30: partitioned as the job turned Running,
    # found by the node controller 4 min later); quiet progress needs a step of this attempt anyway
    if st is None or st.phase in (rljob.Phase.SUCCEEDED.value, rljob.Phase.FAILED.value) or job.spec.suspend:
        return trainersilence.Judged(verdict=nodeloss.Verdict())
    report, _ = lifecycle.trainer_report(job, obs, st.attempt)
    since = trainersilence.quiet_since(report, last_progress=timefmt.parse(st.last_progress_time))
    taken = {p.pod for p in known.lost}
    trainers = [p for p in trainersilence.trainer_pods(obs.pods, attempt=st.attempt) if p.name not in taken]
    peer_silence = float(job.spec.failure_policy.peer_silence_seconds)
    read, wait = trainersilence.watched(trainers, quiet=since, now=now, peer_silence=peer_silence)
    if not read or since is None:
        return trainersilence.Judged(verdict=nodeloss.Verdict(requeue_after=wait))
    nodes = {n: nodeloss.node_facts(cluster.get_node(n), n) for n in read}
    leases = {n: _lease(cluster, n) for n in read}
    witnesses: dict[str, peersilence.Kubelet | None] = {}
    if trainersilence.overdue(nodes, leases, quiet=since, now=now):
        others = sorted({p.node for p in obs.pods if p.node and p.node not in read})
        witnesses = {n: _lease(cluster, n) for n in others}
    judged = trainersilence.judge([p for p in obs.pods if p.name not in taken], trainers, quiet=since, nodes=nodes,
                                  leases=leases, witnesses=witnesses, now=now)
    return dataclasses.replace(judged, quiet_s=max(0.0, (now - since).total_seconds()))


def _avoided(cluster: apply.Cluster, job: rljob.RLJob, lost: nodeloss.Verdict) -> tuple[str, ...]:
    """Nodes the job's new pods keep off (``peersilence.avoided``): those lost in this pass (so the template that
    keeps off them is the one the forced deletes wait for), and the last failure's node while it has not answered
    since (its Node and Lease read only then)."""
    out = {p.node for p in lost.lost if p.failure.reason == nodeloss.REASON}
    last = job.status.last_failure if job.status else None
    if last is not None and last.reason == nodeloss.REASON and last.node and last.node not in out:
        raw = cluster.get_node(last.node)
        facts = nodeloss.node_facts(raw, last.node) if raw is not None else None
        out |= set(peersilence.avoided(last, facts, _lease(cluster, last.node)))
    return tuple(sorted(out))


def _node_loss(cluster: apply.Cluster, obs: observed.Observed, *, now: dt.datetime, grace: float) -> nodeloss.Verdict:
    """The job's pods lost with their node (``nodeloss``): reads only the nodes of pods that are not ready."""
    names = nodeloss.suspects(obs.pods)
    if not names:
        return nodeloss.Verdict()
    nodes = {n: nodeloss.node_facts(cluster.get_node(n), n) for n in names}
    return nodeloss.judge(obs.pods, nodes, now=now, grace=grace)


def _apply_children(cluster: apply.Cluster, key: Key, job: rljob.RLJob, ctx: context.RenderContext,
                    raw: meta.Obj, *, now: dt.datetime, cache: ApplyCache, pool: concurrent.futures.Executor | None,
                    jobs: watchcache.JobCache | None) -> None:
    rendered = render.render(job, ctx)
    try:
        apply_all(cluster, key, rendered.desired, cache=cache, pool=pool)
    except apply.ApiError as exc:
        if exc.status in (409, 429) or exc.status >= 500:
            raise                                   # transient: the router retries with backoff
        # refused for good (invalid, forbidden, an API not served): say so on the job, not only in the operator's
        # log, naming what is missing when it is the gang backend's API; then retry later
        why = gang.explain_refusal(job, exc.status, str(exc), chosen=gang.backend(job, ctx))
        failed = status.apply_failed(job, why, generation=raw["metadata"].get("generation"), now=now)
        _write_status(cluster, key, _status_doc(failed) or {}, jobs)
        cluster.post_event(raw, type="Warning", reason=reasons.APPLY_FAILED, message=why[:1000],
                           now=timefmt.fmt(now))
        raise
    for obj in rendered.absent:
        cluster.delete(obj)
        cache.drop(key, obj)
