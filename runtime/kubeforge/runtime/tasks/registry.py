"""Task kind -> prompt stream. The only place that looks at which TaskSpec source is set.

Neighbours: trainer rank 0 (the data cursor) calls ``stream(spec)`` once and then ``batch``/``prompt_at``.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.tasks import arithmetic, base, code, copy, jsonl

T = TypeVar("T")
Builder = Callable[[rljob.TaskSpec], base.PromptStream]

KINDS: dict[str, Builder] = {
    "arithmetic": lambda s: arithmetic.ArithmeticStream(spec=_need(s.arithmetic, "arithmetic"), seed=s.seed),
    "copy": lambda s: copy.CopyStream(spec=_need(s.copy_, "copy"), seed=s.seed),
    "jsonl": lambda s: jsonl.JsonlStream.from_spec(_need(s.jsonl, "jsonl"), seed=s.seed),
    "code": lambda s: code.CodeStream(spec=_need(s.code, "code"), seed=s.seed),
}


def _need(value: T | None, field: str) -> T:
    if value is None:
        raise base.TaskError(f"spec.task.{field}: not set")
    return value


def kind_of(spec: rljob.TaskSpec) -> str:
    """Which source the spec sets: arithmetic | copy | jsonl | code."""
    kinds = [k for k, v in (("arithmetic", spec.arithmetic), ("copy", spec.copy_), ("jsonl", spec.jsonl),
                            ("code", spec.code)) if v]
    if len(kinds) != 1:
        raise base.TaskError(f"spec.task: {rljob.MSG_ONE_TASK}")
    return kinds[0]


def stream(spec: rljob.TaskSpec) -> base.PromptStream:
    """The prompt stream of a task spec (a JSONL file is read and validated here, once)."""
    return KINDS[kind_of(spec)](spec)


def prompt_at(spec: rljob.TaskSpec, k: int) -> types.Prompt:
    """Prompt ``k`` of the spec's stream (convenience; build a stream once when drawing many)."""
    return stream(spec).prompt_at(k)


def batch(source: base.PromptStream, *, start: int, count: int) -> list[types.Prompt]:
    """Prompts ``[start, start + count)``: the prompts of one step are ``batch(s, start=step*P, count=P)``."""
    return [source.prompt_at(k) for k in range(start, start + count)]
