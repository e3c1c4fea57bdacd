"""The GeneratorPool API (kubeforge.dev/v1alpha1): vLLM engines on one base model shared by LoRA RLJobs.

The package's face, as ``kubeforge.api.rljob`` is for the RLJob: ``spec`` (the object and its spec), ``status``.
``kubeforge.api.crd`` generates its CRD; ``kubeforge.api.load`` parses its manifests; ``kubeforge.api.validate_pool``
checks an RLJob against the pool it names.
"""
from __future__ import annotations

from kubeforge.api.generatorpool.spec import (
    GeneratorPool,
    GeneratorPoolSpec,
    MAX_LORA_RANK,
    MSG_POOL_MODEL_IMMUTABLE,
    MSG_POOL_NAME_TOO_LONG,
    NAME_RULES,
    PoolEngines,
    engine_args,
    PoolMeta,
    PoolModelSpec,
)
from kubeforge.api.generatorpool.status import GeneratorPoolStatus, PoolJobPort

__all__ = [
    "GeneratorPool",
    "GeneratorPoolSpec",
    "GeneratorPoolStatus",
    "MAX_LORA_RANK",
    "MSG_POOL_MODEL_IMMUTABLE",
    "MSG_POOL_NAME_TOO_LONG",
    "NAME_RULES",
    "PoolEngines",
    "PoolMeta",
    "PoolJobPort",
    "PoolModelSpec",
    "engine_args",
]
