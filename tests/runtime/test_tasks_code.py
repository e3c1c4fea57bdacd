"""The procedural code task: deterministic items whose reference answer is tests that a correct solution passes
(run through the CodeExecution sandbox) and a wrong one fails."""
from __future__ import annotations

import pytest

from kubeforge.api import rljob
from kubeforge.runtime.tasks import base, code, registry
from kubeforge.runtime.verifiers import code as code_verifier

SOLUTIONS = {
    "Add": "def f(x):\n    return x + {c}\n",
    "Multiply": "def f(x):\n    return x * {c}\n",
    "Max": "def f(a, b):\n    return max(a, b)\n",
    "Reverse": "def f(s):\n    return s[::-1]\n",
    "Count": "def f(s):\n    return s.count({c!r})\n",
    "Parity": "def f(x):\n    return x % 2 == 0\n",
}


def spec(**kw: object) -> rljob.TaskSpec:
    return rljob.TaskSpec.model_validate({"code": kw, "seed": 3})


def solve(text: str) -> str:
    """A correct solution for a problem statement (parses the constant the statement names)."""
    if "character" in text:
        return SOLUTIONS["Count"].format(c=text.split("character '")[1][0])
    if "plus" in text:
        return SOLUTIONS["Add"].format(c=int(text.split("plus ")[1].split(".")[0]))
    if "times" in text:
        return SOLUTIONS["Multiply"].format(c=int(text.split("times ")[1].split(".")[0]))
    if "larger" in text:
        return SOLUTIONS["Max"]
    if "reversed" in text:
        return SOLUTIONS["Reverse"]
    return SOLUTIONS["Parity"]


def test_items_are_deterministic_and_cover_the_families() -> None:
    s = registry.stream(spec(functions=list(SOLUTIONS), tests=5))
    items = [s.prompt_at(k) for k in range(60)]
    assert items == [registry.stream(spec(functions=list(SOLUTIONS), tests=5)).prompt_at(k) for k in range(60)]
    assert all(p.text.startswith(code.HEADER) and len(p.answer.splitlines()) == 5 for p in items)
    assert len({(p.text, p.answer) for p in items}) == 60
    assert len({p.text.split('`')[1] for p in items}) == 3   # f(x), f(a, b), f(s)
    with pytest.raises(base.TaskError):
        s.prompt_at(-1)


def test_reference_solutions_pass_and_wrong_ones_fail() -> None:
    s = registry.stream(spec(functions=list(SOLUTIONS), tests=4))
    v = code_verifier.CodeExecution(rljob.CodeExecutionVerifier(timeout_seconds=5, parallelism=2))
    for k in range(12):
        p = s.prompt_at(k)
        got = v.score(p, [solve(p.text), "def f(*a):\n    return None\n"])
        assert got[0] == 1.0, (p.text, p.answer)
        assert got[1] < 1.0


def test_exactly_one_task_source() -> None:
    with pytest.raises(ValueError, match=rljob.MSG_ONE_TASK):
        rljob.TaskSpec.model_validate({"code": {}, "copy": {}})
