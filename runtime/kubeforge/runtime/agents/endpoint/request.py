"""An OpenAI ``/v1/chat/completions`` request body, validated: what the endpoint honours, refuses or ignores.

Neighbours: ``endpoint`` decodes the JSON body and calls :func:`parse`; a :class:`Refusal` becomes the HTTP error
(status, OpenAI-style ``error.code``) and is counted by its code.

What happens to each parameter (docs/agents-endpoint.md, "Parameters"):
- honoured: ``messages`` (``tool`` messages with their ``tool_call_id``, assistant ``tool_calls`` included),
  ``model`` (must name the served model), ``max_tokens``/``max_completion_tokens`` (capped by the endpoint), ``stop``,
  ``seed``, ``logprobs`` (the sampled tokens' own), ``tools`` and ``tool_choice`` (auto, none, required or a
  function: rendered by the chat template, each reply parsed into ``tool_calls``: ``agents.toolcalls``; refused
  for a model whose template writes no known tool-call format).
- refused when they differ from the job's distribution, because the trainer's logprobs assume it (docs/runtime.md,
  "Logprob convention"): ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``presence_penalty``,
  ``frequency_penalty``, ``repetition_penalty``, ``logit_bias``; ``n`` > 1; ``top_logprobs`` > 0; ``response_format``
  other than text.
- ``stream: true`` is served as server-sent events, each engine step's text as it is sampled (``server``, ``stream``).
- anything else (``user``, ``metadata``, ``store``, ``parallel_tool_calls``, vLLM extras such as
  ``skip_special_tokens``): ignored.
A refusal of a malformed field names it (``Refusal.param``, OpenAI's ``error.param``: ``tools[0].function.name``).
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from kubeforge.runtime.agents.endpoint import sampler
from kubeforge.runtime.agents.toolcalls import choice as tool_choice

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_MESSAGES = 1024
MAX_STOPS = 4
MAX_STOP_CHARS = 256
MAX_TOOLS = 128
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")     # OpenAI's rule for a function's name
TOLERANCE = 1e-6


class Refusal(Exception):
    """A request the endpoint does not serve: HTTP ``status``, OpenAI ``error.code`` (the counter's reason)."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatRequest:
    messages: tuple[dict[str, Any], ...]
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    tools: list[dict[str, Any]] | None
    logprobs: bool
    tool_choice: tool_choice.Choice = tool_choice.Choice()
    stream: bool = False
    stream_usage: bool = False


def _bad(message: str, param: str | None = None) -> Refusal:
    return Refusal(400, "invalid_request", message, param=param)


def parse(body: Any, *, model: str, policy: sampler.Policy, tool_calls: bool = False) -> ChatRequest:
    """The request in ``body``; ``tool_calls``: the served model's tool-call format is known (``tools`` are refused
    otherwise: its replies could not be read)."""
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    if body.get("model") != model:
        raise Refusal(404, "model_not_found", f"model {body.get('model')!r} is not served here; this endpoint "
                                              f"serves {model!r} (GET /v1/models)")
    _check_distribution(body, policy)
    _check_unsupported(body)
    tools = _tools(body, served=tool_calls)
    return ChatRequest(messages=_messages(body.get("messages")), max_tokens=_max_tokens(body), stop=_stop(body),
                       seed=_int_or_none(body, "seed"), tools=tools, logprobs=bool(body.get("logprobs")),
                       stream=body.get("stream") is True, stream_usage=_stream_usage(body),
                       tool_choice=_tool_choice(body.get("tool_choice"), tools))


def _check_distribution(body: dict[str, Any], policy: sampler.Policy) -> None:
    """Sampling parameters that would change the distribution the trainer assumes: equal to the job's or absent."""
    job = {"temperature": policy.temperature, "top_p": policy.top_p, "top_k": float(policy.top_k),
           "min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
    if policy.top_k == 0 and body.get("top_k") == -1:     # vLLM spells "no top-k" both ways
        body = {**body, "top_k": 0}
    for key, expected in job.items():
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise _bad(f"{key} must be a number")
        if abs(float(value) - expected) > TOLERANCE:
            raise Refusal(400, "unsupported_sampling",
                          f"{key}={value} differs from the job's {expected:g}: the trainer's logprobs assume the "
                          f"job's sampling (spec.algorithm); leave {key} unset")
    if body.get("logit_bias"):
        raise Refusal(400, "unsupported_sampling", "logit_bias changes the job's sampling distribution")
    n = body.get("n")
    if n is not None and n != 1:
        raise Refusal(400, "unsupported_sampling", f"n={n!r}: one choice per call (run n episodes for n samples)")


def _check_unsupported(body: dict[str, Any]) -> None:
    if body.get("stream") not in (None, True, False):
        raise _bad("stream must be a boolean")
    top = body.get("top_logprobs")
    if top not in (None, 0):
        raise Refusal(400, "unsupported", "top_logprobs > 0 is not served (each choice carries its token's logprob)")
    fmt = body.get("response_format")
    if fmt not in (None, {"type": "text"}):
        raise Refusal(400, "unsupported", "response_format other than text is not served")


def _stream_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options must be an object")
    return bool((options or {}).get("include_usage"))


def _messages(raw: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(raw, list) or not raw:
        raise _bad("messages must be a non-empty list")
    if len(raw) > MAX_MESSAGES:
        raise _bad(f"{len(raw)} messages: at most {MAX_MESSAGES}")
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _bad(f"messages[{i}] must be an object with a role in {sorted(ROLES)}")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise _bad(f"messages[{i}].content must be a string, a list of parts or null")
        if isinstance(content, list) and any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
            raise _bad(f"messages[{i}].content: only text parts are served", f"messages[{i}].content")
        _tool_fields(m, f"messages[{i}]")
    return tuple(raw)


def _tool_fields(m: dict[str, Any], where: str) -> None:
    """A ``tool`` message answers one call (its ``tool_call_id``); an assistant's ``tool_calls`` are OpenAI's."""
    if m["role"] == "tool" and (not isinstance(m.get("tool_call_id"), str) or not m["tool_call_id"]):
        raise _bad(f"{where}.tool_call_id: a tool message must name the call it answers", f"{where}.tool_call_id")
    calls = m.get("tool_calls")
    if calls is None:
        return
    if m["role"] != "assistant" or not isinstance(calls, list) or len(calls) > MAX_TOOLS:
        raise _bad(f"{where}.tool_calls: a list of at most {MAX_TOOLS} calls, in assistant messages only",
                   f"{where}.tool_calls")
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if (not isinstance(fn, dict) or not isinstance(c.get("id"), str) or c.get("type", "function") != "function"
                or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str)):
            raise _bad(f"{where}.tool_calls[{j}]: expected {{id, type: function, function: {{name, arguments}}}} "
                       "with arguments as a JSON string", f"{where}.tool_calls[{j}]")


def _int_or_none(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{key} must be an integer")
    return value


def _max_tokens(body: dict[str, Any]) -> int | None:
    a, b = _int_or_none(body, "max_completion_tokens"), _int_or_none(body, "max_tokens")
    value = a if a is not None else b
    if value is not None and value < 1:
        raise _bad(f"max_tokens must be at least 1, got {value}")
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or any(not isinstance(s, str) or not s for s in stops):
        raise _bad("stop must be a string or a list of non-empty strings")
    if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARS for s in stops):
        raise _bad(f"stop: at most {MAX_STOPS} strings of {MAX_STOP_CHARS} characters")
    return tuple(stops)


def _tools(body: dict[str, Any], *, served: bool) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise _bad(f"tools must be a list of at most {MAX_TOOLS} function tools", "tools")
    names: set[str] = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type") != "function":
            raise _bad(f'tools[{i}]: expected {{"type": "function", "function": {{...}}}}', f"tools[{i}]")
        name = fn.get("name")
        if not isinstance(name, str) or not FUNCTION_NAME.match(name) or name in names:
            raise _bad(f"tools[{i}].function.name: {name!r} is not a unique name of 1-64 letters, digits, _ or -",
                       f"tools[{i}].function.name")
        names.add(name)
        for key, kind in (("description", str), ("parameters", dict)):
            if fn.get(key) is not None and not isinstance(fn[key], kind):
                raise _bad(f"tools[{i}].function.{key} must be a {'string' if kind is str else 'JSON object'}",
                           f"tools[{i}].function.{key}")
    if not served:
        raise Refusal(400, "unsupported", "tools: the served model's chat template writes no tool-call format this "
                      "endpoint reads (docs/agents-endpoint.md, Tool calls)", param="tools")
    return tools


def _tool_choice(raw: Any, tools: list[dict[str, Any]] | None) -> tool_choice.Choice:
    if raw is None or raw in (tool_choice.AUTO, tool_choice.NONE):
        return tool_choice.Choice(mode=raw or tool_choice.AUTO)
    if raw == tool_choice.REQUIRED:
        choice = tool_choice.Choice(mode=tool_choice.REQUIRED)
    elif isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict):
        choice = tool_choice.Choice(mode=tool_choice.FUNCTION, name=raw["function"].get("name"))
        offered = {t["function"]["name"] for t in tools or ()}
        if tools and choice.name not in offered:
            raise _bad(f"tool_choice.function.name: {choice.name!r} is none of the tools "
                       f"({', '.join(sorted(offered))})", "tool_choice.function.name")
    else:
        raise _bad(f'tool_choice={raw!r}: "auto", "none", "required" or {{"type": "function", "function": '
                   '{"name": ...}}', "tool_choice")
    if not tools:
        raise _bad(f"tool_choice {choice.mode!r} needs tools", "tool_choice")
    return choice
