"""What a Hugging Face model folder holds, read cheaply: tensor names and shapes from the safetensors headers, and
its chat template (``chat_template.jinja`` or ``tokenizer_config.json``'s, as transformers reads them).

Neighbours: ``config.local_problems`` calls :func:`lora_problems`, so a LoRA ``targetModules`` naming no layer of a
``spec.model.path`` model is refused by the launcher before any process starts and by every role process (a pod
included) before its model or vLLM engine loads; ``kubeforge.api.validate`` holds the built-in models' layers in a
static table (a built-in is built only at start). ``learner.lora.attach`` stays the last word (it also refuses a
name whose module is not an ``nn.Linear``).

Invariants: no torch, no safetensors import: a header is 8 bytes (little-endian length) and that much JSON, read
in microseconds; a header larger than :data:`MAX_HEADER` is not trusted (the check is then skipped, not failed).
A folder without ``*.safetensors`` files (a ``.bin`` checkpoint) gives no names: the check is skipped.
"""
from __future__ import annotations

import json
import pathlib
import struct

from kubeforge.api import rljob

MAX_HEADER = 64 << 20


def weight_shapes(folder: pathlib.Path) -> dict[str, tuple[int, ...]] | None:
    """Every tensor's name and shape in the folder's ``*.safetensors`` files; None when there is none to read."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    out: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with f.open("rb") as fh:
                head = fh.read(8)
                if len(head) != 8:
                    return None
                (n,) = struct.unpack("<Q", head)
                if n > MAX_HEADER:
                    return None
                header = json.loads(fh.read(n))
        except (OSError, ValueError):
            return None
        if not isinstance(header, dict):
            return None
        for name, info in header.items():
            if name != "__metadata__" and isinstance(info, dict) and isinstance(info.get("shape"), list):
                out[name] = tuple(int(x) for x in info["shape"])
    return out


def matrix_layers(shapes: dict[str, tuple[int, ...]]) -> set[str]:
    """Last path components of the modules holding a 2-D ``weight`` (a linear layer's, or an embedding's)."""
    return {name[: -len(".weight")].rsplit(".", 1)[-1] for name, shape in shapes.items()
            if name.endswith(".weight") and len(shape) == 2}


def lora_problems(spec: rljob.ModelSpec) -> list[str]:
    """A ``path`` model's LoRA targets that name no weight matrix of the folder, one message each."""
    if spec.lora is None or spec.path is None:
        return []
    folder = pathlib.Path(spec.path).expanduser()
    shapes = weight_shapes(folder) if folder.is_dir() else None
    if not shapes:
        return []
    layers = matrix_layers(shapes)
    known = sorted(layers)
    shown = ", ".join(known[:16]) + (", ..." if len(known) > 16 else "")
    return [f"spec.model.lora.targetModules[{i}]: Unsupported value: {name!r}: the model at spec.model.path has no "
            f"layer of that name (its weight matrices belong to: {shown})"
            for i, name in enumerate(spec.lora.target_modules) if name not in layers]


def chat_template(folder: pathlib.Path) -> str | None:
    """The folder's default chat template as transformers loads it, or None: ``chat_template.jinja`` first, else
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of named templates: the ``default`` one)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, list):
        value = next((t.get("template") for t in value if isinstance(t, dict) and t.get("name") == "default"), None)
    return value if isinstance(value, str) else None
