"""Mixed precision: float32 master weights and optimizer state, compute in ``spec.model.dtype``.

Role: one place that maps the compute dtype to what the forward pass runs under. Neighbours: ``step.Trainer``
(loads the policy in float32, builds AdamW over it), ``sharding`` (FSDP2's ``MixedPrecisionPolicy`` from
:func:`fsdp_policy`), ``policy.Policy`` (runs under :func:`autocast` when not sharded).

Why: AdamW's first steps move each weight by about the learning rate. At lr 1e-6 on weights of ~0.02, bf16's
rounding step (2^-7 relative, ~1.2e-4) swallows every such update, so pure-bf16 weights never change; the float32
master keeps them and the forward still runs bf16 GEMMs (4-5x faster than fp32 on AMX CPUs, more on GPUs).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MASTER = torch.float32


def compute_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``spec.model.dtype`` (ValueError names the field)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"spec.model.dtype: Unsupported value: {name!r}: supported values: "
                         f"{', '.join(DTYPES)}") from None


def autocast(*, device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager[Any]:
    """Autocast to ``dtype`` on ``device`` (nothing for float32): matmuls in ``dtype``, reductions in float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def fsdp_policy(dtype: torch.dtype) -> Any:
    """FSDP2's policy: parameters all-gathered and computed in ``dtype``, gradients reduced in float32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def adamw(params: list[torch.nn.Parameter], *, lr: float, weight_decay: float,
          device: torch.device) -> torch.optim.AdamW:
    """AdamW over float32 ``params``: the fused kernel on CPU and CUDA (torch supports both), else foreach."""
    fused = device.type in ("cpu", "cuda")
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused or None,
                             foreach=None if fused else True)
