"""An RLJob against the GeneratorPool it names (``spec.generatorPool``): what only the two together can say.

Neighbours: ``kubeforge validate pool.yaml job.yaml`` (``kubeforge.cli``) and ``kubeforge run`` call
:func:`problems` with the pools given beside the jobs; the operator's admission webhook with the pool it reads
from the API server (``kubeforge.operator.admission``). The job's own rule (a pool needs ``spec.model.lora``) is
the model's, checked before (CRD CEL and ``kubeforge.api.load``).

Invariants: pure; one ``path: message`` per problem, worded like ``kubeforge.api.validate``, naming the job's field
to change and the pool's field it disagrees with; the same words from every door.
"""
from __future__ import annotations

from kubeforge.api import generatorpool, rljob, validate


def describe(model: rljob.ModelSource) -> str:
    """A model as a user wrote it: ``builtin: tiny, dtype: float32``."""
    source = f"builtin: {model.builtin}" if model.builtin is not None else f"path: {model.path}"
    return f"{source}, dtype: {model.dtype}"


def pool_problems(pool: generatorpool.GeneratorPool) -> list[str]:
    """What a schema-valid pool's pods must satisfy besides its schema (the roles' pod rules of
    ``kubeforge.api.validate``, at ``spec``), and its engines: tensor parallelism within the pod's GPUs."""
    out = list(validate.pod_problems("spec", pool.spec))
    gpus = validate.gpu_limit(pool.spec)
    if gpus and pool.spec.tensor_parallel_size > gpus:
        out.append(f"spec.tensorParallelSize: Invalid value: {pool.spec.tensor_parallel_size}: should be at most the "
                   f"engines' {validate.GPU} limit ({gpus}): one GPU per tensor-parallel rank")
    return out


def problems(job: rljob.RLJob, pool: generatorpool.GeneratorPool) -> list[str]:
    """Why ``job`` cannot sample on ``pool`` (empty: it can). ``job`` names ``pool`` and has passed its own rules."""
    out: list[str] = []
    name = pool.metadata.name
    if not job.spec.model.same_base(pool.spec.model):
        out.append(f"spec.model: Invalid value: {describe(job.spec.model)}: should be the base model of "
                   f"GeneratorPool {name!r} ({describe(pool.spec.model)}): its engines hold that model and serve "
                   "adapters of it only")
    lora = job.spec.model.lora
    if lora is not None and lora.rank > pool.spec.max_lora_rank:
        out.append(f"spec.model.lora.rank: Invalid value: {lora.rank}: should be at most the maxLoraRank of "
                   f"GeneratorPool {name!r} ({pool.spec.max_lora_rank}): its engines accept no larger adapter")
    return out


def pool_deleted(name: str) -> str:
    """The refusal of a job naming a pool that is being deleted (the webhook sees its deletionTimestamp)."""
    return (f"spec.generatorPool.name: Forbidden: GeneratorPool {name!r} is being deleted: it takes no new jobs "
            "(docs/generator-pool.md)")


def pool_missing(name: str) -> str:
    """The refusal of ``kubeforge validate``/``run`` given pools, none of them the one a job names."""
    return (f"spec.generatorPool.name: Not found: GeneratorPool {name!r} is not among the files given (give the "
            "pool's manifest beside the job's)")
