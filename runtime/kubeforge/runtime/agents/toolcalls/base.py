"""A tool call, the parse of a policy turn, and the ``Format`` interface every model family implements.

Neighbours: ``tagged`` parses, ``hermes`` and ``smollm2`` are the formats, ``registry`` picks one by the model's
chat template, ``choice`` turns a parse into the reply an agent or an environment gets. Nothing here talks HTTP,
vLLM or a tokenizer: the parse is a view over the text the sampled ids decode to, never a re-tokenisation of them.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call as OpenAI returns it: ``arguments`` is the JSON text of an object."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Parsed:
    """A policy turn read for tool calls: ``content`` is the text before the first call (all of it when there is
    none or the markup is malformed); ``problem`` says why the markup did not parse ("" when it did)."""

    content: str
    calls: tuple[ToolCall, ...] = ()
    problem: str = ""


class Format(Protocol):
    """One model family's tool-call format."""

    family: str               # the registry key ("hermes", "smollm2")
    stop: tuple[str, ...]     # where a policy turn that calls a tool may stop (the episode runner's stop strings)
    opens: tuple[str, ...]    # where a call's markup begins (a stream holds its text back from there)

    def supports(self, template: str) -> bool:
        """Whether a model with this chat template writes this format."""
        ...

    def template(self, own: str) -> str | None:
        """A tool-aware chat template to render with instead of ``own`` (None: the model's own renders tools)."""
        ...

    def parse(self, text: str, *, new_id: Callable[[], str] | None = None) -> Parsed:
        """The calls in ``text`` (``new_id()`` names each call; default: :func:`call_id`)."""
        ...


def call_id() -> str:
    """An OpenAI-style call id; no template renders it, so it never reaches the tokens."""
    return f"call_{secrets.token_hex(12)}"


def arguments_json(value: Any) -> str | None:
    """A call's arguments as OpenAI's JSON text of an object (None when they are no object): a model may write the
    object itself or a JSON string of it."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return json.dumps(value, ensure_ascii=False)


def function_schemas(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function objects of OpenAI ``tools`` (``{"type": "function", "function": {...}}``)."""
    return [t["function"] if isinstance(t.get("function"), dict) else t for t in tools]
