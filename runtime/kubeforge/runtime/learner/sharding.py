"""FSDP2 over the trainer replicas, activation checkpointing, and full tensors gathered one at a time.

Role: how the policy's parameters are laid out over the trainer ranks. ``DDP`` (default): every rank holds the
whole float32 policy (``parallel.DataParallel`` averages gradients). ``FSDP``: :func:`shard` applies
``torch.distributed.fsdp.fully_shard`` to every decoder block, then to the policy root; parameters, gradients and
AdamW state are float32 ``DTensor`` shards (``Shard(0)`` over the ranks), gathered in the compute dtype for each
block's forward and backward (``precision.fsdp_policy``), gradients reduce-scattered in float32.
Neighbours: ``step.Trainer`` (calls :func:`shard`, :func:`checkpoint_blocks`, :func:`stream`),
``weightsync.WeightSender`` (consumes a :class:`Stream`), ``export`` (writes one).

Invariants:
- :func:`stream` yields tensors in ``named_parameters`` order (tied weights once) and every rank must iterate it
  to the end in lock-step: each sharded tensor is an all-gather (``DTensor.full_tensor``) over the trainer group.
  The local shard is cast to the target dtype *before* the gather, and only one full tensor exists at a time.
- With one rank nothing is sharded (a plain module): FSDP needs a process group and one rank has nothing to split.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from kubeforge.runtime.learner import precision

FSDP = "FSDP"
DDP = "DDP"


def decoder_blocks(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (``get_decoder().layers``, the HF convention)."""
    decoder = lm.get_decoder()  # type: ignore[operator]
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"spec.roles.trainer.sharding: {type(lm).__name__} has no decoder.layers to shard")
    return list(layers)


def checkpoint_blocks(lm: torch.nn.Module) -> None:
    """Activation checkpointing per transformer block (non-reentrant; HF recomputes each block in backward)."""
    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]
    lm.config.use_cache = False  # type: ignore[union-attr]


def shard(root: torch.nn.Module, *, lm: torch.nn.Module, world_size: int, device: torch.device,
          compute_dtype: torch.dtype) -> None:
    """FSDP2: every decoder block of ``lm`` is its own unit, then ``root`` (the rest: embeddings, norm, head)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    mp = precision.fsdp_policy(compute_dtype)
    for block in decoder_blocks(lm):
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(root, mesh=mesh, mp_policy=mp)


def is_sharded(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def full(t: torch.Tensor, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor (an all-gather for a DTensor: every rank must call it), cast to ``dtype`` first."""
    t = t.detach()
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if is_sharded(t):
        return t.full_tensor()  # type: ignore[attr-defined, no-any-return]
    return t


def assign(p: torch.Tensor, value: torch.Tensor) -> None:
    """Overwrite parameter ``p`` with the full tensor ``value`` (known on every rank): a sharded ``p`` keeps only
    its own slice, taken locally (no communication)."""
    with torch.no_grad():
        if is_sharded(p):
            from torch.distributed.tensor import distribute_tensor

            local = distribute_tensor(value.to(p.dtype), p.device_mesh, p.placements,  # type: ignore[attr-defined]
                                      src_data_rank=None).to_local()
            p.to_local().copy_(local)  # type: ignore[attr-defined]
        else:
            p.copy_(value)


def set_gradient_sync(root: torch.nn.Module, enabled: bool) -> None:
    """FSDP: reduce-scatter gradients in this backward (True) or keep accumulating locally (False)."""
    setter = getattr(root, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


class Stream:
    """Named full tensors of ``params``, gathered lazily; ``meta`` describes them before any gather happens.

    Satisfies ``weightsync.TensorStream``. One pass only: every ``iter()`` continues the same pass, so
    :meth:`drain` after a consumer stopped early (a failed sync) completes exactly the gathers that are left.
    ``dtype`` None keeps each tensor's own dtype."""

    def __init__(self, params: list[tuple[str, torch.Tensor]], *, dtype: torch.dtype | None) -> None:
        self.meta = [Entry(name=n, shape=tuple(p.shape), dtype=dtype if dtype is not None and p.is_floating_point()
                           else p.dtype) for n, p in params]
        self._pass = self._gather(params)

    def _gather(self, params: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for (name, p), e in zip(params, self.meta):
            yield name, full(p, dtype=e.dtype)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._pass

    def drain(self) -> int:
        """Iterate to the end, discarding (what a non-zero rank does while rank 0 sends); returns the count."""
        return sum(1 for _ in self._pass)


def unique_named(module: torch.nn.Module, *, trainable_only: bool = False) -> list[tuple[str, torch.Tensor]]:
    """``named_parameters`` (tied weights appear once, under their first name)."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad or not trainable_only]


# ---------------------------------------------------------------- sharded checkpoints


def dcp_save(directory: Any, *, root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank writes its shards of the model and optimizer into ``directory`` (collective)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    model_sd, optim_sd = get_state_dict(root, optimizer)
    save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(directory))


def dcp_load(directory: Any, *, root: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every rank reads its shards (resharded to this world size) into the model and optimizer (collective)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load

    model_sd, optim_sd = get_state_dict(root, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    load(state, checkpoint_id=str(directory))     # in place: the tensors of model_sd / optim_sd are filled
    set_state_dict(root, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
