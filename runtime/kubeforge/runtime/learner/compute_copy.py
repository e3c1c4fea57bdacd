"""A compute-dtype copy of the float32 policy: cast the weights once per optimizer step, not in every forward.

Role: with bf16 (or fp16) compute on a replicated (DDP, unsharded) policy, ``step.Trainer`` runs every
micro-batch's forward and backward on this copy instead of under ``torch.autocast`` over the float32 masters.
Neighbours: ``step.Trainer`` (builds it, calls :meth:`Shadow.refresh` after every ``optimizer.step()`` and after a
resume), ``precision`` (the masters and AdamW stay float32), ``policy.Policy`` (the copied module).

Why: autocast casts every float32 weight to the compute dtype on every forward (and the LM head again when its
checkpointed chunk is recomputed), casts the float32 residual stream into and out of every matmul, and routes
every weight gradient through a cast back to float32. On the demo's 2-core CPU step the profile put ``copy_`` at
~24% of the step's CPU time (``bench/profile_train_step.py``). Here the weights are cast once per optimizer step
and the whole forward runs in the compute dtype, as FSDP's ``MixedPrecisionPolicy(param_dtype=bf16)`` already does
on the sharded path (so both paths now compute alike).

How gradients reach the masters: each trainable copy parameter has a post-accumulate-grad hook that adds its
(compute-dtype) gradient into the matching master's float32 ``.grad`` and drops the copy's. Per micro-batch this is
what autocast did (a weight's gradient comes out of a bf16 matmul and is cast to float32 before accumulation), so
micro-batches accumulate in float32 exactly as before; DDP's all-reduce, clipping and AdamW see float32 masters.

Numerics vs autocast (stated, tested in tests/runtime/test_trainer_shadow.py): the activations between matmuls are
bf16 here (autocast kept the residual stream and the norms' outputs in float32), and the two gradient
contributions of a tied embedding/LM head are summed in bf16 before the float32 accumulation. Logprobs still come
out of a float32 log-softmax (``logprobs._head_chunk``). Buffers (rotary frequencies) stay float32.

Invariants:
- After :meth:`refresh` every copy parameter equals its master cast to the compute dtype (bit for bit).
- The copy never holds gradients after a backward: they are in the masters.
- Not used under FSDP (its parameters are DTensor shards gathered in the compute dtype by FSDP itself) nor for
  float32 compute (nothing to cast).
"""
from __future__ import annotations

import copy
import functools

import torch


class Shadow:
    """``module``: a copy of ``master`` (a ``torch.nn.Module``) with every parameter in ``dtype`` and float32
    buffers kept; backward through it accumulates float32 gradients into ``master``'s parameters."""

    def __init__(self, master: torch.nn.Module, *, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.module = copy.deepcopy(master)
        masters = dict(master.named_parameters())
        copies = dict(self.module.named_parameters())
        if masters.keys() != copies.keys():
            raise RuntimeError("shadow: the copy's parameters differ from the master's")
        with torch.no_grad():
            for p in copies.values():      # tied parameters are one object: converted once
                if p.is_floating_point() and p.dtype != dtype:
                    p.data = p.data.to(dtype)
        self._all = [(masters[n], copies[n]) for n in masters]
        self._trainable = [(m, c) for m, c in self._all if m.requires_grad]
        for m, c in self._trainable:
            c.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                functools.partial(_into_master, m))

    def refresh(self, *, trainable_only: bool = True) -> None:
        """Copy the masters into the copy (cast to the compute dtype). After each optimizer step the trainable
        parameters are enough; after a resume or any other change of the masters, pass ``trainable_only=False``."""
        pairs = self._trainable if trainable_only else self._all
        if not pairs:
            return
        with torch.no_grad():
            torch._foreach_copy_([c for _, c in pairs], [m.detach() for m, _ in pairs])


def _into_master(master: torch.nn.Parameter, param: torch.Tensor) -> None:
    grad = param.grad
    if grad is None:
        return
    if master.grad is None:
        master.grad = grad.to(master.dtype)
    else:
        master.grad.add_(grad)
    param.grad = None
