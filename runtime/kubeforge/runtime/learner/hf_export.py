"""Export the trained policy as a Hugging Face folder next to the checkpoints, streamed tensor by tensor.

Role: at the end of a job every trainer rank calls ``step.Trainer.export``; the tensors come from the same lazy
stream a weight sync uses (sharded ones gathered one at a time by all ranks) and rank 0 writes them into
safetensors shards as they arrive, so the whole model is never held at once beyond one shard. Neighbours:
``sharding.Stream`` (the tensors), ``checkpoint`` (the folder layout and temp-folder naming), ``models`` (the source
folder whose tokenizer and generation files are copied).

Layout of ``<checkpoint dir>/export-step-000000010/``: ``config.json`` (the source config, ``dtype`` set to the
exported dtype), ``model.safetensors`` or ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``,
and every tokenizer/generation file of the source folder. Written into a temp folder and renamed: it either
exists complete or not at all. ``vllm`` and ``transformers`` load it as they load any HF folder.
"""
from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from kubeforge.runtime import publish

PREFIX = "export-step-"
SHARD_BYTES = 2 << 30
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
SKIP = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json", ".kubeforge-complete"}
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def dir_name(step: int) -> str:
    return f"{PREFIX}{step:09d}"


def plan_shards(sizes: Sequence[int], *, shard_bytes: int) -> list[int]:
    """Shard index of each tensor: consecutive tensors while a shard stays within ``shard_bytes``."""
    out, shard, used = [], 0, 0
    for size in sizes:
        if used and used + size > shard_bytes:
            shard, used = shard + 1, 0
        out.append(shard)
        used += size
    return out


def copy_side_files(source: Path, target: Path) -> list[str]:
    """Copy tokenizer, chat template and generation files (everything but weights and config); their names."""
    copied = []
    for f in sorted(source.iterdir()):
        if f.is_file() and f.name not in SKIP and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy2(f, target / f.name)
            copied.append(f.name)
    return copied


def write(*, target: Path, tensors: Iterable[tuple[str, torch.Tensor]], sizes: Sequence[int], config: Any,
          source: Path | None, dtype: torch.dtype, shard_bytes: int = SHARD_BYTES,
          side: Callable[[Path], Any] | None = None) -> Path:
    """Write an HF folder at ``target`` atomically from ``tensors`` (``sizes``: their byte sizes, in order);
    ``side(tmp)`` may add more (e.g. the LoRA adapter) before the folder is published."""
    with publish.folder(target) as tmp:
        shards = plan_shards(sizes, shard_bytes=shard_bytes)
        count = (shards[-1] + 1) if shards else 1
        names = ["model.safetensors"] if count == 1 else [f"model-{i + 1:05d}-of-{count:05d}.safetensors"
                                                           for i in range(count)]
        weight_map: dict[str, str] = {}
        current: dict[str, torch.Tensor] = {}
        shard = 0
        for (name, t), s in zip(tensors, shards):
            if s != shard:
                safetensors.torch.save_file(current, str(tmp / names[shard]), metadata={"format": "pt"})
                current, shard = {}, s
            current[name] = t.detach().to("cpu").contiguous()
            weight_map[name] = names[s]
        safetensors.torch.save_file(current, str(tmp / names[shard]), metadata={"format": "pt"})
        if count > 1:
            index = {"metadata": {"total_size": int(sum(sizes))}, "weight_map": weight_map}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
        cfg = copy.deepcopy(config)
        cfg.dtype = DTYPE_NAMES.get(dtype, "float32")
        cfg.use_cache = True
        cfg.save_pretrained(str(tmp))
        if source is not None:
            copy_side_files(source, tmp)
        if side is not None:
            side(tmp)
    return target
