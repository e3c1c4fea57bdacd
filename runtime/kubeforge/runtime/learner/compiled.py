"""``spec.roles.trainer.compile``: each transformer block of the module the micro-batches run, through torch.compile.

Role: ``step.Trainer`` calls :func:`compile_blocks` once on its compute module (the bf16 compute copy when there is
one, else the policy) and, when the first compiled step raises, :func:`uncompile_blocks` before it runs that step
again eagerly. Neighbours: ``sharding.decoder_blocks`` (finds the blocks), ``evaluate`` (runs generation with
compiled blocks forced eager: its shapes would only recompile), ``step.Trainer``.

Why: on the demo's CPU step (bf16 compute copy, 2 cores; ``bench/profile_train_step.py``) about half of the step
was not matrix multiplication but elementwise work between them (RMSNorm's float32 round trip, RoPE, SiLU x up,
residual adds, the casts), each an operator call of its own in forward and again in backward. Inductor fuses each
block's elementwise work into a few generated loops, forward and backward (AOTAutograd), and leaves the matmuls
to the same library kernels as eager.

How: ``block.compile(dynamic=True, backend=...)`` on every block. All blocks share one code object and (since
torch inlines modules, parameters being graph inputs) one compiled graph, so a model compiles once however deep
it is; shapes are dynamic from the start, so a new batch shape (rows, prompt length) does not recompile. The
compile happens in the first step's forward (and its backward graph in the first backward).

Numerics: the same operations in the same dtypes; fused loops may keep an intermediate in float32 where eager
rounded it to bf16 between ops, so results agree within bf16 rounding, not bit for bit (tested against eager in
tests/runtime/test_trainer_compiled.py).

Invariants: compiling never changes what a step computes beyond that rounding; a failure to compile costs one
eager retry of the first step (gradients cleared first), never the run. Not applied under FSDP sharding (its
per-block hooks gather parameters around the block's call).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kubeforge.runtime.learner import sharding

Backend = str | Callable[..., Any]


def compile_blocks(lm: torch.nn.Module, *, backend: Backend = "inductor") -> int:
    """Compile every decoder block of the HF causal LM ``lm`` in place (lazily: at its first call). Returns how many."""
    blocks = sharding.decoder_blocks(lm)
    for block in blocks:
        block.compile(dynamic=True, backend=backend)
    return len(blocks)


def uncompile_blocks(lm: torch.nn.Module) -> None:
    """Undo :func:`compile_blocks`: every block runs its eager forward again."""
    for block in sharding.decoder_blocks(lm):
        block._compiled_call_impl = None


def is_compiled(lm: torch.nn.Module) -> bool:
    return any(getattr(b, "_compiled_call_impl", None) is not None for b in sharding.decoder_blocks(lm))
