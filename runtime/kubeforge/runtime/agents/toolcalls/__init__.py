"""Native tool calls: each model family's tool-call format, rendered through its chat template and parsed back into
OpenAI ``tool_calls`` (docs/agents-endpoint.md, "Tool calls"). ``base`` (a call, a parse, the ``Format`` interface),
``tagged`` (the ``<tool_call>JSON</tool_call>`` parser both known families share), ``hermes`` (Qwen2.5, Hermes),
``smollm2`` (SmolLM2-Instruct), ``choice`` (``tool_choice`` and what a reply becomes), ``registry`` (family by
template). Callers write ``toolcalls.registry.for_template``; the modules import each other, never this face."""
from kubeforge.runtime.agents.toolcalls import base, choice, hermes, registry, smollm2, tagged

__all__ = ["base", "choice", "hermes", "registry", "smollm2", "tagged"]
