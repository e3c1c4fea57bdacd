"""Procedural code problems: write a small Python function ``f``; the reference answer is its tests.

Neighbours: ``registry`` builds it from ``TaskSpec.code``; the CodeExecution verifier (``verifiers.code``) runs a
completion's code against the answer's tests (one ``assert`` per line) in its sandbox.

Families (``CodeFunction``), each with its parameters drawn per item:
  Add       f(x) returns x + c                 Multiply  f(x) returns x * c
  Max       f(a, b) returns the larger         Reverse   f(s) returns s reversed
  Count     f(s) returns how often ch occurs   Parity    f(x) returns True when x is even
Test inputs are drawn per item too, so no two items share tests by construction.

Invariant: item k depends only on (spec, seed, k).
"""
from __future__ import annotations

import dataclasses
import random

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.tasks import base

HEADER = "Write a Python function"


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcde") for _ in range(rng.randint(0, 7)))


def _problem(kind: str, rng: random.Random, n: int) -> tuple[str, list[str]]:
    if kind == "Add":
        c = rng.randint(1, 20)
        xs = [rng.randint(-50, 50) for _ in range(n)]
        return f"`f(x)` that returns x plus {c}.", [f"assert f({x}) == {x + c}" for x in xs]
    if kind == "Multiply":
        c = rng.randint(2, 9)
        xs = [rng.randint(-20, 20) for _ in range(n)]
        return f"`f(x)` that returns x times {c}.", [f"assert f({x}) == {x * c}" for x in xs]
    if kind == "Max":
        pairs = [(rng.randint(-99, 99), rng.randint(-99, 99)) for _ in range(n)]
        return "`f(a, b)` that returns the larger of a and b.", [f"assert f({a}, {b}) == {max(a, b)}" for a, b in pairs]
    if kind == "Reverse":
        ws = [_word(rng) for _ in range(n)]
        return "`f(s)` that returns the string s reversed.", [f"assert f({w!r}) == {w[::-1]!r}" for w in ws]
    if kind == "Count":
        ch = rng.choice("abcde")
        ws = [_word(rng) for _ in range(n)]
        return (f"`f(s)` that returns how many times the character {ch!r} occurs in s.",
                [f"assert f({w!r}) == {w.count(ch)}" for w in ws])
    if kind == "Parity":
        xs = [rng.randint(-100, 100) for _ in range(n)]
        return "`f(x)` that returns True when x is even and False otherwise.", [
            f"assert f({x}) is {x % 2 == 0}" for x in xs]
    raise base.TaskError(f"spec.task.code.functions: unknown function family {kind!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CodeStream:
    spec: rljob.CodeTask
    seed: int

    def prompt_at(self, k: int) -> types.Prompt:
        rng = base.rng_for(self.seed, k, "code")
        kind = rljob.CodeFunction(rng.choice(self.spec.functions)).value
        text, tests = _problem(kind, rng, self.spec.tests)
        return types.Prompt(index=k, text=f"{HEADER} {text} Answer with the code only.", answer="\n".join(tests))
