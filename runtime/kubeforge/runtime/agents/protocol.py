"""The environment protocol users implement (``spec.environment.type: Python``) and the built-ins follow.

``make_env()`` (the ``entryPoint``) returns one environment object per episode::

    messages = env.reset(prompt)          # the chat messages the episode starts from: [{"role", "content"}, ...]
    result = env.step(assistant_text)     # after each policy turn: StepResult(observation, done, reward, ...)

A ``str`` observation is one ``{"role": "user", "content": ...}`` message. ``reward`` counts when ``done`` (the
last reward an episode got is its environment reward). Neighbours: ``host`` runs these calls (in process for unit
tests, in a child process in the roles); ``runner`` drives episodes; ``check_result`` is the one place that tells
a well-formed step result from garbage.

Native tool calls (``spec.environment.toolFormat: Native``): the runner reads each policy turn in the model's own
tool-call format and ``step`` is given OpenAI's assistant message as JSON (:func:`native_turn` reads it); the
environment answers each call, in order, with a ``{"role": "tool", "content": ...}`` message (the runner names the
call each answers). Messages stay (role, content) pairs on every host and wire: a start message in which the
assistant called tools (a worked example) is written with :func:`assistant_tool_calls`, which the runner expands
into ``tool_calls`` for the chat template.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from kubeforge.runtime import types

ROLES = ("user", "tool", "system")   # roles an observation message may take (the policy's turns are "assistant")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepResult:
    """What the environment answers a policy turn with."""

    observation: list[dict[str, str]] | str
    done: bool
    reward: float | None = None
    tool_calls: int = 0
    tool_errors: int = 0


class Environment(Protocol):
    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]: ...

    def step(self, assistant_text: str) -> StepResult: ...


class Garbage(ValueError):
    """An environment answered something that is not a step result (or not chat messages)."""


def check_messages(value: Any, *, where: str) -> list[dict[str, str]]:
    """``value`` as chat messages (a string: one user message); ``Garbage`` naming what is wrong otherwise."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value else []
    if not isinstance(value, list):
        raise Garbage(f"{where}: expected a list of messages or a string, got {type(value).__name__}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise Garbage(f"{where}[{i}]: expected {{'role': str, 'content': str}}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def check_result(value: Any) -> StepResult:
    """``value`` (a ``StepResult`` or a dict of its fields, as it comes back from a child process) checked."""
    if isinstance(value, dict):
        try:
            value = StepResult(**value)
        except TypeError as e:
            raise Garbage(f"step: {e}") from None
    if not isinstance(value, StepResult):
        raise Garbage(f"step: expected a StepResult, got {type(value).__name__}")
    obs = check_messages(value.observation, where="step.observation")
    if type(value.done) is not bool:
        raise Garbage("step.done: expected a bool")
    reward = value.reward
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                               or not math.isfinite(reward)):
        raise Garbage(f"step.reward: expected a finite number or None, got {reward!r}")
    for name in ("tool_calls", "tool_errors"):
        v = getattr(value, name)
        if type(v) is not int or not 0 <= v <= 1_000:
            raise Garbage(f"step.{name}: expected an int in [0, 1000], got {v!r}")
    return StepResult(observation=obs, done=value.done, reward=None if reward is None else float(reward),
                      tool_calls=value.tool_calls, tool_errors=value.tool_errors)


TOOL_CALLS_MARK = "kubeforge.tool_calls:"   # an assistant start message's content: this, then its calls as JSON


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One call of a native policy turn: its id, the function's name, its arguments (a JSON object, decoded)."""

    id: str
    name: str
    arguments: dict[str, Any]


def assistant_tool_calls(calls: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, str]:
    """A start message in which the assistant called ``calls`` ((name, arguments) each), for toolFormat Native."""
    return {"role": "assistant",
            "content": TOOL_CALLS_MARK + json.dumps([{"name": n, "arguments": a} for n, a in calls])}


def native_turn(text: str) -> tuple[str, list[ToolCall]]:
    """A native policy turn as ``step`` is given it (OpenAI's assistant message, JSON): its content ("" when none)
    and its calls. A turn whose markup did not parse has content only (the runner counts it a tool error)."""
    message = json.loads(text)
    calls = [ToolCall(id=c["id"], name=c["function"]["name"], arguments=json.loads(c["function"]["arguments"]))
             for c in message.get("tool_calls") or ()]
    return str(message.get("content") or ""), calls


def as_dict(result: StepResult) -> dict[str, Any]:
    """A step result as plain data (what a child process sends back: msgpack, never pickle)."""
    return dataclasses.asdict(result)


def close(env: Any) -> None:
    """The episode of ``env`` ended: an environment with a ``close()`` (optional in the protocol; CodeFeedback's
    releases its sandbox lease) is told so. Its failure is printed, never raised: the host goes on."""
    fn = getattr(env, "close", None)
    if callable(fn):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - the environment's failure must not stop its host
            print(f"environment close: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
