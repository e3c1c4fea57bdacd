"""Native tool calls in the episode runner (``spec.environment.toolFormat: Native``): the tools rendered by the model's
chat template, each policy turn read in the model's tool-call format, the environment's answers fed back as ``tool``
messages.

Neighbours: ``runner`` asks :class:`Native` for the rendering kwargs, the text a step is given and the messages an
answer becomes; ``toolcalls`` reads the turns; ``protocol`` is the environment's side (``native_turn``,
``assistant_tool_calls``); ``envs.registry`` holds an environment type's tools.

Invariants: the policy's token ids are never touched (a turn is read as text, the ids stay what vLLM sampled); the
environment's messages stay (role, content) pairs on every host and wire: the call ids a ``tool`` message answers are
given here, in order, from the turn it answers, and a worked example's assistant calls are expanded here.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kubeforge.runtime.agents import protocol
from kubeforge.runtime.agents.toolcalls import base as tool_base
from kubeforge.runtime.agents.toolcalls import choice as tool_choice
from kubeforge.runtime.agents.toolcalls import registry as tool_registry


class NoToolFormat(ValueError):
    """The model's chat template writes no tool-call format kubeforge reads."""


class Native:
    """One job's native tool calls: its model's format and its environment's tools."""

    def __init__(self, *, tokenizer: Any, tools: Sequence[dict[str, Any]], chat_template: bool) -> None:
        own = getattr(tokenizer, "chat_template", None) if chat_template else None
        fmt = tool_registry.for_template(own if isinstance(own, str) else None)
        if fmt is None or not tools:
            why = "no tools" if not tools else (
                "spec.task.chatTemplate is false" if not chat_template else
                f"the model's chat template writes no tool-call format kubeforge reads ({tool_registry.families()})")
            raise NoToolFormat(f"spec.environment.toolFormat: Invalid value: 'Native': {why}; use toolFormat Tags")
        assert isinstance(own, str)
        self.format: tool_base.Format = fmt
        self.tools = [dict(t) for t in tools]
        self.offered = frozenset(f["name"] for f in tool_base.function_schemas(self.tools))
        self.template = fmt.template(own)

    def render(self) -> dict[str, Any]:
        """The keyword arguments of ``chat.start_ids`` and ``chat.delta``."""
        return {"tools": self.tools, "template": self.template}

    def start(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """An environment's start messages for the template: worked calls expanded, their answers named."""
        out: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for i, m in enumerate(messages):
            content = str(m.get("content", ""))
            if m.get("role") == "assistant" and content.startswith(protocol.TOOL_CALLS_MARK):
                listed = json.loads(content[len(protocol.TOOL_CALLS_MARK):])
                calls = [{"id": f"call_start_{i}_{j}", "type": "function",
                          "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                         for j, c in enumerate(listed)]
                out.append({"role": "assistant", "content": "", "tool_calls": calls})
            else:
                out += self.answers([m], calls) if m.get("role") == "tool" else [dict(m)]
                calls = calls[1:] if m.get("role") == "tool" else calls
        return out

    def read(self, text: str) -> tool_choice.Reply:
        """A policy turn read for calls (``choice`` auto)."""
        return tool_choice.reply(self.format, text, offered=self.offered, choice=tool_choice.Choice())

    @staticmethod
    def step_text(reply: tool_choice.Reply) -> str:
        """What the environment's ``step`` is given: OpenAI's assistant message, JSON (``protocol.native_turn``)."""
        return json.dumps(reply.message())

    @staticmethod
    def answers(observation: Sequence[dict[str, Any]], calls: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The observation with each ``tool`` message naming the call it answers (the turn's calls, in order)."""
        out, k = [], 0
        for m in observation:
            m = dict(m)
            if m.get("role") == "tool" and k < len(calls):
                m["tool_call_id"] = calls[k]["id"]
                k += 1
            out.append(m)
        return out
