"""The LoRA adapter format: PEFT's layout, which the learner writes and the generator (vLLM) reads.

Role: the one home of what an adapter is on disk and by name, shared by both sides of the weight sync. The learner
(``learner.lora``) puts adapters into the trained model under these names and exports them with
:func:`save_adapter`; the generator (``generator.extension``) writes each synced adapter with :func:`save_adapter`
and ``generator.engine`` hands vLLM the folder with :func:`adapter_config`.

Names (PEFT's convention, so vLLM and PEFT read our files): a targeted linear layer keeps its weight
``...q_proj.weight``; its adapters are ``...q_proj.lora_A.weight`` (``r x in``) and ``...q_proj.lora_B.weight``
(``out x r``), and in the adapter file ``base_model.model.<name>`` (:data:`PEFT_PREFIX`). A folder holds
:data:`WEIGHTS` (safetensors) and :data:`CONFIG` (``adapter_config.json``).

Invariant: a folder is written atomically (temp + rename, ``publish.folder``): a reader sees a whole adapter or none.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from kubeforge.api import rljob
from kubeforge.runtime import publish

PEFT_PREFIX = "base_model.model."
CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def is_adapter(name: str) -> bool:
    """``name`` is an adapter tensor's (``...lora_A.weight`` / ``...lora_B.weight``), not a base weight's."""
    return ".lora_A." in name or ".lora_B." in name


def adapter_config(spec: rljob.LoraSpec, *, base: str) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` for our adapters."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec.rank, "lora_alpha": spec.alpha,
            "target_modules": sorted(spec.target_modules), "lora_dropout": 0.0, "bias": "none",
            "fan_in_fan_out": False, "use_rslora": False, "use_dora": False, "modules_to_save": None,
            "base_model_name_or_path": base, "inference_mode": True}


def save_adapter(target: Path, tensors: Iterable[tuple[str, torch.Tensor]], *, config: dict[str, Any]) -> Path:
    """Write a PEFT adapter folder atomically (temp + rename); ``tensors`` carry our names (prefix added)."""
    with publish.folder(target) as tmp:
        weights = {PEFT_PREFIX + n: t.detach().to("cpu").contiguous() for n, t in tensors}
        safetensors.torch.save_file(weights, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=1, sort_keys=True))
    return target
