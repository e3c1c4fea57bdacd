"""What validation knows about the built-in models without building them: a static table (no torch here).

Neighbours: ``kubeforge.api.validate`` refuses a LoRA ``targetModules`` name, a ``maxNewTokens`` or a
``maxModelLen`` that a built-in model cannot honour; ``kubeforge.runtime.models`` builds the models themselves.
``tests/runtime/test_builtins_table.py`` builds each model and checks this table against it, so the table cannot
drift from the code that builds the models.

Invariants: one entry per ``rljob.BuiltinModel``; ``lora_layers`` are the last path components of the model's
``nn.Linear`` modules that take an adapter (every linear layer of the decoder blocks; not ``lm_head``: in both
built-ins it is tied to the input embedding, whose merged export would lose the adapter, and vLLM's Qwen2 serves no
adapter on it); ``context`` is the model's ``max_position_embeddings`` (prompt + completion tokens);
``tool_format`` the tool-call family its chat template writes (None: no template, so ``toolFormat: Native`` is
refused).
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import rljob


@dataclasses.dataclass(frozen=True, kw_only=True)
class Builtin:
    """Facts about one built-in model."""

    context: int                     # max_position_embeddings: prompt + completion tokens at most
    lora_layers: tuple[str, ...]     # linear layers (last path component) that take a LoRA adapter
    tool_format: str | None          # the tool-call family its chat template writes (runtime.agents.toolcalls)


_DECODER_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

BUILTINS: dict[str, Builtin] = {
    rljob.BuiltinModel.TINY.value: Builtin(context=512, lora_layers=_DECODER_LINEARS, tool_format=None),
    rljob.BuiltinModel.SMOLLM2_135M_INSTRUCT.value: Builtin(context=8192, lora_layers=_DECODER_LINEARS,
                                                            tool_format="smollm2"),
}


def of(spec: rljob.ModelSpec) -> tuple[str, Builtin] | None:
    """The built-in model of ``spec`` (its name and facts), or None for a ``path`` model."""
    if spec.builtin is None:
        return None
    name = spec.builtin.value if isinstance(spec.builtin, rljob.BuiltinModel) else str(spec.builtin)
    return name, BUILTINS[name]
