"""``spec.generatorPool``: the job's generators are a GeneratorPool's engines instead of its own
(docs/generator-pool.md).

The rules that need only the job are here (a pool serves LoRA adapters, so the job must train one); the rules that
need the pool too (same base model, rank within the pool's limit) are ``kubeforge.api.validate_pool``'s.
"""
from __future__ import annotations

from pydantic import Field

from kubeforge.api.rljob.base import IMMUTABLE, NAME_PATTERN, Model, cel

MSG_POOL_NEEDS_LORA = ("generatorPool: requires spec.model.lora: a GeneratorPool's engines serve LoRA adapters of "
                       "their base model, so a job that trains every weight needs generators of its own")
MSG_POOL_IMMUTABLE = f"spec.generatorPool {IMMUTABLE}"

#: The RLJobSpec's CEL rules about the pool (the pydantic validator of RLJobSpec raises the first's message). The
#: immutability rule sits on the spec, which is always present: on the optional field itself it would not run when
#: the field is added or removed.
SPEC_RULES = (
    cel("!has(self.generatorPool) || has(self.model.lora)", MSG_POOL_NEEDS_LORA),
    cel("has(self.generatorPool) == has(oldSelf.generatorPool) && "
        "(!has(self.generatorPool) || self.generatorPool == oldSelf.generatorPool)", MSG_POOL_IMMUTABLE),
)


class GeneratorPoolRef(Model):
    """A GeneratorPool in the job's namespace whose engines sample the job's rollouts with its adapter."""

    name: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN, description="The GeneratorPool's name.")
