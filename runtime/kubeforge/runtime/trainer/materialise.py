"""Build a sharded policy without ever holding the whole model: meta-device init, then each rank reads its shards.

Role: under ``sharding: FSDP`` with more than one rank, ``step.Trainer`` builds the HF model with :func:`empty`
(parameters on the meta device: no memory; buffers real), wraps and shards it (``sharding.shard``: every
parameter becomes a ``DTensor`` whose local shard is still meta), then calls :func:`load` once: parameters get
uninitialised local storage of their shard size (``to_empty``) and every rank reads *only its slices* of each
tensor from the folder's safetensors (``torch.distributed.checkpoint`` with its Hugging Face storage reader:
``safe_open(...).get_slice(...)[rows]``, cast to the float32 master dtype on copy). No rank ever materialises a
full parameter, so peak memory at start is one shard per rank, not the model. Neighbours: ``step.Trainer``,
``sharding`` (the layout), ``lora`` (adapters are not in the folder: :func:`load` leaves them to
``lora.initialise``).

Invariants:
- Non-persistent buffers (rotary ``inv_freq``...) are computed for real at construction (only parameters go to
  meta) and survive ``to_empty`` (saved and copied back): they are not in the checkpoint files.
- Every parameter of the model that is not an adapter must be found in the folder (tied weights once, under the
  name ``named_parameters`` reports first); a missing one is a ValueError naming it and the folder.
- Collective: every rank of the trainer group calls :func:`load` (DCP plans the reads globally).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

META = torch.device("meta")


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside the block is moved to the meta device at once (buffers are not)."""
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device != META:
            old = module._parameters[name]
            assert old is not None
            module._parameters[name] = torch.nn.Parameter(old.to(META), requires_grad=old.requires_grad)

    setattr(torch.nn.Module, "register_parameter", register)
    try:
        yield
    finally:
        setattr(torch.nn.Module, "register_parameter", original)


def empty(path: str | Path) -> torch.nn.Module:
    """The HF causal LM of the folder ``path`` with float32 parameters on the meta device (no storage)."""
    config = transformers.AutoConfig.from_pretrained(str(path))
    with _parameters_on_meta():
        model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32)
    return model


def load(lm: torch.nn.Module, *, path: str | Path, device: torch.device,
         skip: Callable[[str], bool] = lambda name: False) -> None:
    """Give ``lm``'s (sharded, meta) parameters storage on ``device`` and fill each rank's shards from the
    safetensors of ``path``; parameters for which ``skip(name)`` holds are left uninitialised (the caller's).
    Collective over the trainer group."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    buffers = {n: b.detach().clone() for n, b in lm.named_buffers() if b.device != META}
    owners: dict[int, tuple[torch.nn.Module, str]] = {}
    ties = []                      # to_empty replaces a shared parameter once per owner: tie them again after
    for module in lm.modules():
        for name, p in module._parameters.items():
            if p is not None:
                first = owners.setdefault(id(p), (module, name))
                if first != (module, name):
                    ties.append((module, name, first))
    lm.to_empty(device=device)
    for module, name, (first, first_name) in ties:
        module._parameters[name] = first._parameters[first_name]
    with torch.no_grad():
        for n, b in lm.named_buffers():
            if n in buffers:
                b.copy_(buffers[n])
    reader = HuggingFaceStorageReader(str(path))
    stored = set(reader.read_metadata().state_dict_metadata)
    wanted: dict[str, Any] = {n: p for n, p in lm.named_parameters() if not skip(n)}
    missing = sorted(set(wanted) - stored)
    if missing:
        raise ValueError(f"spec.model.path: {path} has no tensor {missing[0]!r} (of {len(missing)} missing)")
    with torch.no_grad():
        dcp_load(wanted, storage_reader=reader)
