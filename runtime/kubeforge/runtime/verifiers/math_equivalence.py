"""MathEquivalence: 1 when math-verify finds the completion's answer equivalent to the reference, else 0.

Neighbours: ``registry`` builds it for ``type: MathEquivalence``. The reference is parsed once per group (the
batched call); each completion is parsed and verified against it.
math-verify bounds parsing time with ``signal.alarm``, which only works on the main thread: timeouts are used there,
and off the main thread (tests, thread pools) parsing runs without them.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

import math_verify

from kubeforge.runtime import types

TIMEOUT_S = 5


def _timeout() -> int | None:
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


class MathEquivalence:
    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        timeout = _timeout()
        gold = self._parse_gold(prompt.answer, timeout)
        if not gold:
            raise ValueError(f"reference answer {prompt.answer!r} of prompt {prompt.index} does not parse")
        out = []
        for c in completions:
            pred = math_verify.parse(c, parsing_timeout=timeout)
            ok = bool(pred) and math_verify.verify(gold, pred, timeout_seconds=timeout)
            out.append(1.0 if ok else 0.0)
        return out

    @staticmethod
    def _parse_gold(answer: str, timeout: int | None) -> list[Any]:
        text = answer if "$" in answer or "\\boxed" in answer else f"${answer}$"
        gold: list[Any] = math_verify.parse(text, parsing_timeout=timeout)
        return gold or math_verify.parse(answer, parsing_timeout=timeout)
