"""Chat messages to prompt token ids without re-tokenisation drift: the endpoint's one rule for building prompts.

Neighbours: ``server`` asks :func:`plan` for every ``/v1/chat/completions`` call of an episode; ``record``
keeps what it decided. Nothing here talks HTTP or vLLM: a tokenizer (HF ``PreTrainedTokenizer``-like) is the only
dependency, so the rule is unit-tested with the tiny model's tokenizer.

The rule (docs/agents-endpoint.md, "No re-tokenisation drift"):

- The first call of a branch renders its messages with the chat template (generation prompt appended) and tokenises
  the text: those are the branch's prompt ids.
- A later call *extends* the previous one when its messages are the previous call's messages, then the assistant
  message the endpoint returned (same content), then anything new. Its prompt is then the previous call's exact
  prompt ids + the exact ids vLLM sampled + the ids of the *delta text*: the chat template's rendering of the new
  conversation past the previous prompt and the assistant's content, with what the model itself emitted after its
  content (e.g. its end-of-turn token) taken off the front. Only the delta is ever tokenised; sampled ids are never
  re-tokenised, so the trainer sees exactly what vLLM sampled.
- Anything else (history rewritten or truncated, a different assistant message, a template that does not render
  the old conversation as a prefix of the new one) starts a new *branch*: its prompt is the full rendering,
  tokenised afresh. :class:`Plan` says why (``Plan.reason``) and the endpoint counts it.

Models whose tokenizer has no chat template (the ``tiny`` built-in) get :data:`PLAIN_TEMPLATE`:
``role: content`` lines, then ``assistant:`` as the generation prompt.

Tool calls (``agents.toolcalls``): :class:`ChatTemplate` knows the model's tool-call format from its template (and
renders with the format's tool-aware template where the model's own ignores tools). A reply the endpoint returned
with ``tool_calls`` is extended like any other: the agent echoes it (content and calls, compared with the arguments
read as JSON), and the delta is rendered with that message standing as the text vLLM sampled, so what the model
wrote stays exactly its sampled ids and the template's own rendering of the calls never reaches the tokens.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from kubeforge.runtime.agents.toolcalls import base as tool_base
from kubeforge.runtime.agents.toolcalls import registry as tool_registry

PLAIN_TEMPLATE = (
    "{%- for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor -%}"
    "{%- if add_generation_prompt %}assistant: {% endif -%}"
)

# What a branch starts for (Plan.reason); "extends" is the only reason that keeps the previous ids.
EXTENDS = "extends"
FIRST = "first"
REWRITTEN = "history_rewritten"          # the new messages do not start with the previous call's + its reply
TEMPLATE_UNSTABLE = "template_unstable"  # the template's rendering of the old messages is no prefix of the new
BRANCH_REASONS = (FIRST, REWRITTEN, TEMPLATE_UNSTABLE)


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content-part list (OpenAI's two shapes)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")


def normalise(message: dict[str, Any]) -> dict[str, Any]:
    """The parts of a message that reach the template (and so the tokens): role, content as text, and tool fields
    when set. Clients echo assistant messages with extra null fields (``refusal``, ``annotations``, ...): ignored."""
    out: dict[str, Any] = {"role": str(message.get("role", "")), "content": _content_text(message.get("content"))}
    for key in ("name", "tool_call_id"):
        if message.get(key):
            out[key] = message[key]
    if message.get("tool_calls"):
        out["tool_calls"] = [_tool_call(c) for c in message["tool_calls"]]
    return out


def _tool_call(call: Any) -> dict[str, Any]:
    """OpenAI's call with its arguments as a JSON object where they are one: what chat templates index (HF's
    convention), and a comparison that does not hang on how a client spaced the JSON it echoes."""
    fn = call.get("function") or {}
    args: Any = fn.get("arguments")
    if isinstance(args, str):
        try:
            parsed = json.loads(args)
        except ValueError:
            parsed = None
        args = parsed if isinstance(parsed, dict) else args
    return {"id": call.get("id"), "type": "function", "function": {"name": fn.get("name"), "arguments": args}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Turn:
    """What the previous call of a branch left: its messages (normalised), its exact prompt ids, the ids vLLM
    sampled and their text (cut at a stop string: the content the endpoint returned when it found no tool calls);
    ``reply``: the assistant message it returned when that was not ``content`` alone (``tool_calls``), normalised."""

    messages: tuple[dict[str, Any], ...]
    prompt_ids: tuple[int, ...]
    sampled_ids: tuple[int, ...]
    content: str
    reply: dict[str, Any] | None = None

    def expected(self) -> dict[str, Any]:
        """The assistant message an extending call echoes (normalised)."""
        return self.reply or {"role": "assistant", "content": self.content}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """The prompt of one call: ``prompt_ids`` in full; when it extends the previous call, ``delta_ids`` are the ids
    appended after the previous prompt and sample (the environment's turn), else ``delta_ids`` is empty and
    ``reason`` says why a new branch starts."""

    prompt_ids: tuple[int, ...]
    delta_ids: tuple[int, ...]
    delta_text: str
    messages: tuple[dict[str, Any], ...]
    reason: str

    @property
    def extends(self) -> bool:
        return self.reason == EXTENDS


class ChatTemplate:
    """Rendering and tokenising through one tokenizer (its own chat template, else :data:`PLAIN_TEMPLATE`)."""

    def __init__(self, tokenizer: Any, *, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        own = getattr(tokenizer, "chat_template", None)
        self.template: str | None = template or (None if own else PLAIN_TEMPLATE)
        # the model's tool-call format (None: tools are refused), and the template that renders its tools
        source = str(template or own or "")
        self.tool_format: tool_base.Format | None = tool_registry.for_template(source)
        self.template = (self.tool_format.template(source) if self.tool_format else None) or self.template

    def render(self, messages: Sequence[dict[str, Any]], *, generation_prompt: bool,
               tools: list[dict[str, Any]] | None = None) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt}
        if tools:
            kwargs["tools"] = tools
        if self.template is not None:
            kwargs["chat_template"] = self.template
        text = self.tokenizer.apply_chat_template(list(messages), **kwargs)
        return str(text)

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of rendered text; the template already wrote any BOS, so no special tokens are added."""
        return tuple(int(x) for x in self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], *, skip_special: bool) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special))


def plan(chat: ChatTemplate, messages: Sequence[dict[str, Any]], previous: Turn | None, *,
         tools: list[dict[str, Any]] | None = None) -> Plan:
    """The prompt of a call with ``messages``, given the branch's ``previous`` call (None: the episode's first)."""
    norm = tuple(normalise(m) for m in messages)
    reason = FIRST if previous is None else _extension_problem(norm, previous)
    if previous is not None and reason == EXTENDS:
        delta = _delta_text(chat, norm, previous, tools=tools)
        if delta is not None:
            ids = chat.encode(delta)
            return Plan(prompt_ids=previous.prompt_ids + previous.sampled_ids + ids, delta_ids=ids,
                        delta_text=delta, messages=norm, reason=EXTENDS)
        reason = TEMPLATE_UNSTABLE
    text = chat.render(norm, generation_prompt=True, tools=tools)
    return Plan(prompt_ids=chat.encode(text), delta_ids=(), delta_text="", messages=norm, reason=reason)


def _extension_problem(norm: tuple[dict[str, Any], ...], previous: Turn) -> str:
    """EXTENDS when ``norm`` = the previous messages + the assistant reply the endpoint returned (+ more)."""
    k = len(previous.messages)
    if len(norm) <= k or norm[:k] != previous.messages:
        return REWRITTEN
    reply, expected = norm[k], previous.expected()
    if any(reply.get(key) != expected.get(key) for key in ("role", "content", "tool_calls")):
        return REWRITTEN
    return EXTENDS


def _delta_text(chat: ChatTemplate, norm: tuple[dict[str, Any], ...], previous: Turn, *,
                tools: list[dict[str, Any]] | None) -> str | None:
    """The text to feed after the previous prompt and sample, or None when the template is not prefix-stable
    (it renders the old conversation differently once more messages follow, or rewrites the assistant content)."""
    k = len(previous.messages)
    sampled = {"role": "assistant", "content": previous.content}    # the reply as the text vLLM sampled
    before = chat.render(previous.messages, generation_prompt=True, tools=tools)
    after = chat.render((*norm[:k], sampled, *norm[k + 1:]), generation_prompt=True, tools=tools)
    if not after.startswith(before):
        return None
    rest = after[len(before):]
    if not rest.startswith(previous.content):
        return None
    tail = rest[len(previous.content):]
    emitted = chat.decode(previous.sampled_ids, skip_special=False)
    extra = emitted[len(previous.content):] if emitted.startswith(previous.content) else ""
    # what the model emitted past its content (an end-of-turn token) is in the sampled ids already
    return tail[len(extra):] if extra and tail.startswith(extra) else tail
