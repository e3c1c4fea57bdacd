"""An OpenAI ``/v1/chat/completions`` request body, validated: what the endpoint honours, refuses or ignores.

Neighbours: ``endpoint`` decodes the JSON body and calls :func:`parse`; a :class:`Refusal` becomes the HTTP error
(status, OpenAI-style ``error.code``) and is counted by its code.

What happens to each parameter (docs/agents-endpoint.md, "Parameters"):
- honoured: ``messages``, ``model`` (must name the served model), ``max_tokens``/``max_completion_tokens`` (capped by
  the endpoint), ``stop``, ``seed``, ``tools`` (given to the chat template), ``logprobs`` (the sampled tokens' own).
- refused when they differ from the job's distribution, because the trainer's logprobs assume it (docs/runtime.md,
  "Logprob convention"): ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``presence_penalty``,
  ``frequency_penalty``, ``repetition_penalty``, ``logit_bias``; ``n`` > 1; ``top_logprobs`` > 0; ``tool_choice``
  other than auto/none; ``response_format`` other than text.
- ``stream: true`` is served as server-sent events, each engine step's text as it is sampled (``server``, ``stream``).
- anything else (``user``, ``metadata``, ``store``, vLLM extras such as ``skip_special_tokens``): ignored.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from kubeforge.runtime.agents.endpoint import sampler

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_MESSAGES = 1024
MAX_STOPS = 4
MAX_STOP_CHARS = 256
TOLERANCE = 1e-6


class Refusal(Exception):
    """A request the endpoint does not serve: HTTP ``status``, OpenAI ``error.code`` (the counter's reason)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatRequest:
    messages: tuple[dict[str, Any], ...]
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    tools: list[dict[str, Any]] | None
    logprobs: bool
    stream: bool = False
    stream_usage: bool = False


def _bad(message: str) -> Refusal:
    return Refusal(400, "invalid_request", message)


def parse(body: Any, *, model: str, policy: sampler.Policy) -> ChatRequest:
    if not isinstance(body, dict):
        raise _bad("the body must be a JSON object")
    if body.get("model") != model:
        raise Refusal(404, "model_not_found", f"model {body.get('model')!r} is not served here; this endpoint "
                                              f"serves {model!r} (GET /v1/models)")
    _check_distribution(body, policy)
    _check_unsupported(body)
    return ChatRequest(messages=_messages(body.get("messages")), max_tokens=_max_tokens(body), stop=_stop(body),
                       seed=_int_or_none(body, "seed"), tools=_tools(body), logprobs=bool(body.get("logprobs")),
                       stream=body.get("stream") is True, stream_usage=_stream_usage(body))


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
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise Refusal(400, "unsupported", f"tool_choice={choice!r}: only 'auto' or 'none'")
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
            raise _bad(f"messages[{i}].content: only text parts are served")
    return tuple(raw)


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


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or any(not isinstance(t, dict) for t in tools):
        raise _bad("tools must be a list of objects")
    return tools or None
