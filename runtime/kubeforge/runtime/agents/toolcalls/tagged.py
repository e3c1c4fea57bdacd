"""The parser of ``<tool_call>JSON</tool_call>`` blocks, which both known families write: Hermes/Qwen2.5 one JSON
object per block, SmolLM2 a JSON list of them in one block. Either shape is read in either family (a model that
writes the other shape still meant a call).

A call is ``{"name": str, "arguments": object}`` (``parameters`` is read as ``arguments``; absent: ``{}``; a JSON
string of an object is read as the object). Anything else inside a block, a block that does not close (a turn cut
by its token limit) or invalid JSON makes the whole turn malformed: no calls, the whole text as content, and the
problem named. A block list that is empty (``[]``: SmolLM2's "no call needed") is no call. Text after the first
block is not content (OpenAI's content is what precedes the calls).
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubeforge.runtime.agents.toolcalls import base

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PROBLEM_CHARS = 200


class _Malformed(ValueError):
    pass


def parse(text: str, *, new_id: Callable[[], str] | None = None, open_tag: str = OPEN,
          close_tag: str = CLOSE) -> base.Parsed:
    start = text.find(open_tag)
    if start < 0:
        return base.Parsed(content=text)
    try:
        calls = _calls(text[start:], new_id or base.call_id, open_tag, close_tag)
    except _Malformed as exc:
        return base.Parsed(content=text, problem=str(exc)[:PROBLEM_CHARS])
    if not calls:
        return base.Parsed(content=text)
    return base.Parsed(content=text[:start], calls=tuple(calls))


def _calls(text: str, new_id: Callable[[], str], open_tag: str, close_tag: str) -> list[base.ToolCall]:
    out: list[base.ToolCall] = []
    pos = 0
    while (i := text.find(open_tag, pos)) >= 0:
        j = text.find(close_tag, i + len(open_tag))
        if j < 0:
            raise _Malformed(f"{open_tag} without {close_tag}")
        payload = text[i + len(open_tag):j].strip()
        try:
            value = json.loads(payload)
        except ValueError as exc:
            raise _Malformed(f"not JSON inside {open_tag}: {exc}") from None
        out += [_call(item, new_id) for item in (value if isinstance(value, list) else [value])]
        pos = j + len(close_tag)
    return out


def _call(item: Any, new_id: Callable[[], str]) -> base.ToolCall:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        raise _Malformed('a call must be an object with a "name"')
    raw = item.get("arguments", item.get("parameters", {}))
    arguments = base.arguments_json(raw)
    if arguments is None:
        raise _Malformed(f'the arguments of {item["name"]!r} are no JSON object')
    return base.ToolCall(id=new_id(), name=item["name"], arguments=arguments)
