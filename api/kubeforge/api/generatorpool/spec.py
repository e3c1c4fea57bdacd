"""The GeneratorPool object: vLLM engines on one base model that serve the LoRA adapters of the RLJobs attached to it
(``spec.generatorPool``; docs/generator-pool.md).

Built from the RLJob's parts where the meaning is the same: the model type (without ``lora``: a pool's model is the
base every attached job trains an adapter of), the generator role's engine settings, a role's pod settings. The
same invariants as the RLJob model (``kubeforge.api.rljob.base``): camelCase wire names, every field described,
every CEL rule raised by a validator with the same message.
"""
from __future__ import annotations

from typing import Any, ClassVar, Literal

import pydantic
from pydantic import Field

from kubeforge.api import contract, rljob
from kubeforge.api.generatorpool.status import GeneratorPoolStatus
from kubeforge.api.rljob.base import cel, schema_extra

MSG_POOL_MODEL_IMMUTABLE = "spec.model is immutable while the pool exists"
MSG_POOL_NAME_TOO_LONG = (f"must be no more than {contract.MAX_POOL_NAME_LENGTH} characters, so that the names of "
                          "the pool's children fit DNS limits")
#: The largest adapter rank a pool may accept: vLLM's largest ``max_lora_rank``.
MAX_LORA_RANK = rljob.LORA_RANKS[-1]


class PoolModelSpec(rljob.ModelSource):
    """The base model of every engine: exactly one source and a dtype (each attached job brings its adapter)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(rljob.ONE_MODEL_RULE, cel("self == oldSelf", MSG_POOL_MODEL_IMMUTABLE)))


class PoolEngines(rljob.Model):
    """What every engine of a pool serves: the base model, how many adapters at once, how large."""

    model: PoolModelSpec = Field(description="The base model of every engine; attached jobs must name the same "
                                 "(source and dtype) and train LoRA adapters of it.")
    max_adapters: int = Field(8, ge=1, le=256, description="Adapters resident per engine at once (vLLM max_loras); "
                              "beyond it adapters are swapped in and out, least recently used first.")
    max_lora_rank: int = Field(16, ge=1, le=MAX_LORA_RANK, description="The largest adapter rank the engines accept "
                               "(vLLM max_lora_rank, rounded up to a rank vLLM supports): an attached job's "
                               "spec.model.lora.rank may not exceed it.")


class GeneratorPoolSpec(rljob.EngineSettings, rljob.PodSettings, PoolEngines):
    """Desired state of a GeneratorPool: its engines, vLLM generators with LoRA enabled."""

    replicas: int = Field(1, ge=1, le=4096, description="Engines: pods, each one vLLM engine serving every "
                          "attached job.")


class PoolMeta(rljob.ObjectMeta):
    """The parts of ObjectMeta a pool manifest may carry; its name rules are ``NAME_RULES``."""

    name_limit: ClassVar[int] = contract.MAX_POOL_NAME_LENGTH
    name_too_long: ClassVar[str] = MSG_POOL_NAME_TOO_LONG


NAME_RULES = rljob.name_rules(max_length=contract.MAX_POOL_NAME_LENGTH, too_long=MSG_POOL_NAME_TOO_LONG)


def engine_args(spec: GeneratorPoolSpec) -> dict[str, Any]:
    """The vLLM engine arguments every engine of a pool with ``spec`` runs with, as far as the spec decides them:
    LoRA enabled for ``maxAdapters`` adapters of rank up to ``maxLoraRank`` (rounded up to a rank vLLM accepts), the
    base model's dtype, the engine settings. The operator renders them into the pool's config; the engines read
    them there."""
    out: dict[str, Any] = {
        **rljob.lora_engine_args(rank=spec.max_lora_rank, adapters=spec.max_adapters),
        "dtype": str(getattr(spec.model.dtype, "value", spec.model.dtype)),
        "tensor_parallel_size": spec.tensor_parallel_size,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "enforce_eager": spec.enforce_eager,
    }
    if spec.max_model_len is not None:
        out["max_model_len"] = spec.max_model_len
    return out


class GeneratorPool(rljob.Model):
    """A pool of vLLM engines on one base model, shared by the RLJobs that name it and train LoRA adapters."""

    model_config = pydantic.ConfigDict(json_schema_extra=schema_extra(*NAME_RULES))

    api_version: Literal["kubeforge.dev/v1alpha1"] = Field("kubeforge.dev/v1alpha1", alias="apiVersion")
    kind: Literal["GeneratorPool"] = "GeneratorPool"
    metadata: PoolMeta
    spec: GeneratorPoolSpec
    status: GeneratorPoolStatus | None = None
