"""A GeneratorPool's status and finalizer, computed (pure) from what a pool pass observed.

Role: the "status" step of a pool pass (``poolreconcile`` observes and writes). Neighbours: ``status`` (the
conditions' merge, shared with RLJobs). Invariants:
- ``readyEngines`` counts ready pods of the pool's StatefulSet; ``attachedJobs`` every RLJob of the namespace whose
  ``spec.generatorPool.name`` is the pool, a job being deleted included (it may still sample until it is gone);
- ``jobPorts`` is the port block of each attached job (``poolports.assign``), the record the next pass keeps them
  by and the one a job's pass reads its own from; a suspended job (:func:`suspended`) keeps its block, but the
  engines do not serve it (it leaves the jobs file: its share and adapter slot are released) until it resumes; a
  finished one (:func:`finished`: Succeeded or Failed) keeps its block and leaves the jobs file for good (it is
  still attached until it is deleted: it names the pool);
- ``residentAdapters`` and ``utilisation`` are the engines' to report: carried over, never invented here;
- the finalizer ``names.POOL_FINALIZER`` is on every pool that is not being deleted, and comes off a deleted pool
  only once no job is attached (docs/generator-pool.md: deleting a pool in use waits).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kubeforge.api import contract, generatorpool, rljob
from kubeforge.operator import names, reasons, status

# ---- the pool's condition types and reasons ----
READY = "Ready"                       # every engine is ready
TERMINATING = "Terminating"           # the pool is being deleted (True: it waits for its attached jobs)
ENGINES_READY = "EnginesReady"
ENGINES_NOT_READY = "EnginesNotReady"
NO_MASTER_KEY = "NoMasterKey"         # the operator has no pool master key: the engines are not rendered
WAITING_FOR_JOBS = "WaitingForJobs"   # deleted, but RLJobs still name it: the finalizer holds it
RELEASED = "Released"                 # deleted and no job attached: the finalizer comes off

_TERMINAL = (rljob.Phase.SUCCEEDED.value, rljob.Phase.FAILED.value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolFacts:
    """What a pool pass observed: engines ready, the attached jobs (sorted), whether the pool is being deleted, and
    the port block of each attached job that has one (``poolports.assign``; sorted by job)."""

    ready_engines: int
    attached: tuple[str, ...]
    deleting: bool
    ports: tuple[tuple[str, int], ...] = ()
    keyed: bool = True       # the operator holds a pool master key (else nothing is rendered: ``NO_MASTER_KEY``)


def attached_jobs(pool: str, jobs: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """Names of the RLJob bodies (one namespace's) whose ``spec.generatorPool.name`` is ``pool``, sorted."""
    return tuple(sorted({str(j["metadata"]["name"]) for j in jobs
                         if ((j.get("spec") or {}).get("generatorPool") or {}).get("name") == pool}))


def suspended(job: Mapping[str, Any]) -> bool:
    """Whether an attached job (its raw body) holds no pods now by its spec or Kueue's word, so the engines do not
    serve it: ``spec.suspend`` is true, or its ``Suspended`` condition is True (written by its own pass: Kueue has
    not admitted it or evicted it), or it is a Kueue workload whose pass has not said yet (not admitted as far as
    anything shows)."""
    if (job.get("spec") or {}).get("suspend") is True:
        return True
    conds = ((job.get("status") or {}).get("conditions")) or []
    said = next((c.get("status") for c in conds if isinstance(c, Mapping) and c.get("type") == reasons.SUSPENDED),
                None)
    if said is not None:
        return bool(said == "True")
    return bool(((job.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_KUEUE_QUEUE))


def finished(job: Mapping[str, Any]) -> bool:
    """Whether an attached job (its raw body) has ended: its phase is Succeeded or Failed (terminal: its own pass
    writes it once and nothing restarts the job, ``lifecycle``). Its pods are gone, so the engines drop it (its
    channel, its adapter slot) rather than keep both until the job is deleted."""
    return ((job.get("status") or {}).get("phase")) in _TERMINAL


def held(job: Mapping[str, Any]) -> bool:
    """Whether the engines do not serve an attached job now: suspended (it may resume) or finished (for good)."""
    return suspended(job) or finished(job)


def compute(pool: generatorpool.GeneratorPool, facts: PoolFacts, *, generation: int | None,
            now: dt.datetime) -> generatorpool.GeneratorPoolStatus:
    """The pool's status from ``facts``; conditions merged with the previous ones (``status.merge_conditions``)."""
    before = pool.status or generatorpool.GeneratorPoolStatus()
    want = pool.spec.replicas
    ready = (True, ENGINES_READY, f"all {want} engines are ready") if facts.ready_engines >= want else \
        (False, ENGINES_NOT_READY, f"{facts.ready_engines}/{want} engines ready")
    if not facts.keyed:
        ready = (False, NO_MASTER_KEY, "the operator has no pool master key (--pool-master-key-file; the chart "
                 "mounts one): the engines are not rendered and the attached jobs get no pods")
    conds: dict[str, status.Cond] = {READY: ready}
    if facts.deleting:
        conds[TERMINATING] = (True, WAITING_FOR_JOBS, "deleted; waiting for the RLJobs that name it to go: "
                              + ", ".join(facts.attached)) if facts.attached else \
            (True, RELEASED, "deleted; no RLJob names it")
    return generatorpool.GeneratorPoolStatus(
        observed_generation=generation, conditions=status.merge_conditions(
            before.conditions, conds, generation=generation, now=now),
        replicas=want, ready_engines=facts.ready_engines, ready=f"{facts.ready_engines}/{want}",
        attached_jobs=list(facts.attached), attached=len(facts.attached),
        job_ports=[generatorpool.PoolJobPort(name=j, port_base=b) for j, b in facts.ports],
        resident_adapters=before.resident_adapters, utilisation=before.utilisation)


def finalizers(current: Sequence[str], facts: PoolFacts) -> list[str] | None:
    """The pool's finalizers as they must be (None: as they are): ``names.POOL_FINALIZER`` added to a live pool,
    removed from a deleted one no job names."""
    has = names.POOL_FINALIZER in current
    if not facts.deleting and not has:
        return [*current, names.POOL_FINALIZER]
    if facts.deleting and has and not facts.attached:
        return [f for f in current if f != names.POOL_FINALIZER]
    return None
