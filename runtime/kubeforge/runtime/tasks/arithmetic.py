"""Procedural arithmetic: "What is a op b?" with the integer result as the answer.

Neighbours: ``registry`` builds it from ``TaskSpec.arithmetic``; ExactAnswer/MathEquivalence verifiers score it
(the answer is a plain integer, possibly negative).
Invariant: operands have exactly ``digits`` digits (0-9 when digits is 1); item k depends only on (spec, seed, k).
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.tasks import base

_APPLY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArithmeticStream:
    """Prompts like ``What is 23 + 45? Answer with the number only.``; answer ``68``."""

    spec: rljob.ArithmeticTask
    seed: int

    def prompt_at(self, k: int) -> types.Prompt:
        rng = base.rng_for(self.seed, k, "arithmetic")
        lo = 0 if self.spec.digits == 1 else 10 ** (self.spec.digits - 1)
        hi = 10 ** self.spec.digits - 1
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        op = str(rljob.ArithmeticOp(rng.choice(list(self.spec.operations))).value)
        text = f"What is {a} {op} {b}? Answer with the number only."
        return types.Prompt(index=k, text=text, answer=str(_APPLY[op](a, b)))
