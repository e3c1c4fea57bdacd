"""Prompt streams: where prompts and reference answers come from, one small module per task kind.

Neighbours: trainer rank 0 owns the data cursor and calls ``prompt_at``/``batch`` to build WORK messages
(``wire.Work``); verifiers compare completions against ``Prompt.answer``; the generator applies the chat template
(``TaskSpec.chatTemplate``), so streams return plain text.

Invariants:
- ``prompt_at(spec, k)`` is a pure function of (task spec, ``spec.seed``, k): any process, any restart, same prompt.
  Nothing here keeps state between calls except an immutable, validated copy of a JSONL file's records.
- ``Prompt.index == k``: the cursor position travels with the prompt (the verifier routes by it).
- Bad input (a JSONL file that is missing, empty, or has a bad record) raises ``TaskError`` naming the file, line and
  field.
"""
from __future__ import annotations

from kubeforge.runtime.tasks.base import PromptStream, TaskError, rng_for
from kubeforge.runtime.tasks.registry import KINDS, batch, kind_of, prompt_at, stream

__all__ = ["KINDS", "PromptStream", "TaskError", "batch", "kind_of", "prompt_at", "rng_for", "stream"]
