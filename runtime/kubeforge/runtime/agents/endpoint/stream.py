"""A chat completion as server-sent events while the engine samples it: OpenAI's ``chat.completion.chunk`` shapes,
their framing, and the text each engine step adds.

Neighbours: ``server`` reads a ``sampler.Pending``'s steps, asks :class:`TextDeltas` for the text each adds, shapes
it with :class:`Chunks` and writes each chunk through its :class:`Reply` (the HTTP handler). Nothing here talks
HTTP or vLLM.

The stream of one call (docs/agents-endpoint.md, "Streaming")::

    data: {role chunk: delta {"role": "assistant", "content": ""}}        sent before the first token
    data: {delta {"content": <text of step 1>}, logprobs of its tokens}   one per engine step that adds text
    ...
    data: {delta {"tool_calls": [{index, id, type, function}, ...]}}     when the reply holds tool calls
    data: {delta {"content": <the rest>} or {}, finish_reason}            the last choice chunk
    data: {"choices": [], "usage": {...}}                                  when stream_options.include_usage
    data: [DONE]

Invariants:
- The contents of the chunks concatenate to the non-streamed ``message.content`` of the same sample: text is sent
  only once it extends what was sent, an incomplete UTF-8 character and any tail that may begin a stop string are
  held back (OpenAI's content ends before the stop string), and the last chunk carries the rest. When tools are
  parsed, text from where a call's markup may begin is held back too (``holds``): it goes out at the end as
  ``tool_calls`` when it parses, else as the rest of the content.
- Every token's logprob is sent once, in the chunk of the step that sampled it (``logprobs: true``).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

DONE = b"data: [DONE]\n\n"
REPLACEMENT = "\ufffd"      # what a decoder writes for the first bytes of a character whose rest is still to come


def event(payload: dict[str, Any]) -> bytes:
    """One server-sent event: a ``data:`` line of JSON and the blank line that ends it."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class Reply(Protocol):
    """Where a call's answer goes (the HTTP handler): a whole JSON body, or a stream of events."""

    def send(self, status: int, payload: dict[str, Any]) -> None: ...

    def open_stream(self) -> bool:
        """Send the 200 and the event-stream headers; False when the client is gone."""
        ...

    def event(self, payload: dict[str, Any]) -> bool:
        """Send one event now; False when the client is gone (nothing more will reach it)."""
        ...

    def end_stream(self) -> None:
        """Send ``data: [DONE]`` and end the body."""
        ...


class Chunks:
    """The ``chat.completion.chunk`` objects of one call."""

    def __init__(self, *, ident: str, created: int, model: str) -> None:
        self.head: dict[str, Any] = {"id": ident, "object": "chat.completion.chunk", "created": created,
                                     "model": model}

    def _choice(self, delta: dict[str, Any], *, logprobs: list[dict[str, Any]] | None = None,
                finish_reason: str | None = None) -> dict[str, Any]:
        return self.head | {"choices": [{"index": 0, "delta": delta,
                                         "logprobs": None if logprobs is None else {"content": logprobs},
                                         "finish_reason": finish_reason}]}

    def role(self) -> dict[str, Any]:
        return self._choice({"role": "assistant", "content": ""})

    def delta(self, content: str, *, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        return self._choice({"content": content}, logprobs=logprobs)

    def tool_calls(self, calls: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Every call of the reply in one delta (OpenAI's streamed shape: each with its ``index``)."""
        return self._choice({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]})

    def finish(self, content: str, *, finish_reason: str) -> dict[str, Any]:
        return self._choice({"content": content} if content else {}, finish_reason=finish_reason)

    def usage(self, *, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return self.head | {"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                      "completion_tokens": completion_tokens,
                                                      "total_tokens": prompt_tokens + completion_tokens}}


class TextDeltas:
    """The text each step adds: the decoding of every id so far, less what was sent, less what must wait."""

    def __init__(self, *, decode: Callable[[Sequence[int]], str], stops: Sequence[str],
                 holds: Sequence[str] = ()) -> None:
        self._decode, self._stops, self._holds = decode, tuple(stops), tuple(holds)
        self._ids: list[int] = []
        self.sent = ""

    def feed(self, ids: Sequence[int]) -> str:
        """The new text that may go out after ``ids`` were sampled ("" when it must wait)."""
        self._ids += ids
        safe = self._sendable(self._decode(self._ids))
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        new, self.sent = safe[len(self.sent):], safe
        return new

    def finish(self, content: str) -> str:
        """The rest of the call's final content (what the non-streamed response says)."""
        return content[len(self.sent):] if content.startswith(self.sent) else ""

    def _sendable(self, text: str) -> str:
        cuts = [i for i in (text.find(s) for s in self._stops + self._holds) if i >= 0]
        if cuts:
            return text[:min(cuts)]
        text = text.rstrip(REPLACEMENT)
        hold = max((k for s in self._stops + self._holds for k in range(1, len(s)) if text.endswith(s[:k])),
                   default=0)
        return text[:len(text) - hold]


def token_logprobs(tokens: Sequence[str], logprobs: Sequence[float]) -> list[dict[str, Any]]:
    """OpenAI's ``logprobs.content`` entries of sampled tokens (no alternatives: ``top_logprobs`` is refused)."""
    return [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs)]
