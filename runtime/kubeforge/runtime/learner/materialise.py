"""Build a sharded policy without ever holding the whole model: meta-device init, then each rank reads its shards.

Role: under ``sharding: FSDP`` with more than one rank, ``step.Trainer`` builds the HF model with :func:`empty`
(parameters on the meta device: no memory; buffers real), wraps and shards it (``sharding.shard``: every
parameter becomes a ``DTensor`` whose local shard is still meta), then calls :func:`load` once: parameters get
uninitialised local storage of their shard size (``to_empty``) and every rank reads *only its slices* of each
tensor from the folder's safetensors: FSDP2 shards every parameter on dim 0, so a rank's shard is one contiguous byte range of
the row-major tensor, read with plain file reads straight into the shard (or into one shard-sized buffer when the
file's dtype differs, then cast). No mmap: the file's pages never count as the process's memory. No rank ever
materialises a full parameter, so the memory at start is one shard per rank, not the model. Neighbours: ``step.Trainer``,
``sharding`` (the layout), ``lora`` (adapters are not in the folder: :func:`load` leaves them to
``lora.initialise``).

Invariants:
- Non-persistent buffers (rotary ``inv_freq``...) are computed for real at construction (only parameters go to
  meta) and survive ``to_empty`` (saved and copied back): they are not in the checkpoint files.
- Every parameter of the model that is not an adapter must be found in the folder (tied weights once, under the
  name ``named_parameters`` reports first); a missing one is a ValueError naming it and the folder.
- No communication: each rank computes its own rows (``torch.chunk``'s split, as FSDP2 shards).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import transformers

from kubeforge.runtime.learner import sharding

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
    safetensors of ``path``; parameters for which ``skip(name)`` holds are left uninitialised (the caller's)."""
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
    for module, name, (owner, owner_name) in ties:
        module._parameters[name] = owner._parameters[owner_name]
    with torch.no_grad():
        for n, b in lm.named_buffers():
            if n in buffers:
                b.copy_(buffers[n])
    index = tensor_index(Path(path))
    wanted = [(n, p) for n, p in lm.named_parameters() if not skip(n)]
    missing = [n for n, _ in wanted if n not in index]
    if missing:
        raise ValueError(f"spec.model.path: {path} has no tensor {missing[0]!r} (of {len(missing)} missing)")
    with torch.no_grad():
        for n, p in wanted:
            read_rows(index[n], into=p, name=n)


@dataclasses.dataclass(frozen=True)
class Stored:
    """Where one tensor lies in a safetensors file: absolute byte offset of its data, dtype, shape."""

    file: Path
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def tensor_index(folder: Path) -> dict[str, Stored]:
    """Every tensor of the folder's ``*.safetensors`` files, from their headers (nothing else is read)."""
    out: dict[str, Stored] = {}
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in _DTYPES:
                raise ValueError(f"spec.model.path: {file}: tensor {name!r} has unsupported dtype {info['dtype']}")
            out[name] = Stored(file=file, offset=8 + size + int(info["data_offsets"][0]),
                               dtype=_DTYPES[info["dtype"]], shape=tuple(int(x) for x in info["shape"]))
    return out


def _local_rows(p: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this rank's storage of ``p``, the first global row it holds): a ``DTensor`` sharded on dim 0 (FSDP2's
    layout: torch.chunk's split), or a whole tensor at row 0."""
    if not sharding.is_sharded(p):
        return p.data, 0
    from torch.distributed.tensor import Shard

    placements = tuple(p.placements)  # type: ignore[attr-defined]
    local: torch.Tensor = p.to_local()  # type: ignore[attr-defined]
    if len(placements) != 1 or not isinstance(placements[0], Shard) or placements[0].dim != 0:
        raise ValueError(f"materialise: {placements} is not a dim-0 sharding")
    rank = p.device_mesh.get_local_rank()  # type: ignore[attr-defined]
    per = -(-p.shape[0] // p.device_mesh.size())  # type: ignore[attr-defined]
    return local, min(rank * per, p.shape[0])


def read_rows(stored: Stored, *, into: torch.Tensor, name: str) -> None:
    """Read only the rows of ``stored`` that ``into`` (a parameter, sharded or not) holds here, with plain file
    reads (no mmap: the file's pages never count as this process's memory), cast to ``into``'s dtype."""
    if tuple(into.shape) != stored.shape:
        raise ValueError(f"spec.model.path: tensor {name!r} has shape {list(stored.shape)} in {stored.file}, the "
                         f"model expects {list(into.shape)}")
    local, row0 = _local_rows(into)
    if local.numel() == 0:
        return
    row_bytes = math.prod(stored.shape[1:]) * torch.empty((), dtype=stored.dtype).element_size()
    direct = local.dtype == stored.dtype and local.is_contiguous() and local.device.type == "cpu"
    buf = local if direct else torch.empty(tuple(local.shape), dtype=stored.dtype)
    view = memoryview(buf.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
    with stored.file.open("rb", buffering=0) as f:
        f.seek(stored.offset + row0 * row_bytes)
        done = 0
        while done < len(view):
            n = f.readinto(view[done:])
            if not n:
                raise ValueError(f"spec.model.path: {stored.file} ends inside tensor {name!r}")
            done += n
    if not direct:
        local.copy_(buf)
