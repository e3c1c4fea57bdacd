"""verifiers: extraction and normalisation, each verifier's table of cases, the registry, Scorer (weighted reward,
one batched call per verifier per group, cache, errors counted and scored 0)."""
from __future__ import annotations

import math
import threading
from typing import Sequence

import pytest

from kubeforge.api import rljob
from kubeforge.runtime import types, verifiers
from kubeforge.runtime.verifiers import exact, extract, math_equivalence, regex


def prompt(answer: str, text: str = "q") -> types.Prompt:
    return types.Prompt(index=0, text=text, answer=answer)


def group(answer: str, texts: Sequence[str]) -> types.RolloutGroup:
    return types.RolloutGroup(prompt=prompt(answer), prompt_token_ids=[1],
                              completions=[types.Completion(token_ids=[], logprobs=[], text=t) for t in texts],
                              policy_version=0)


def vspec(name: str, kind: str, weight: float = 1.0, **kw: object) -> rljob.VerifierSpec:
    return rljob.VerifierSpec.model_validate({"name": name, "type": kind, "weight": weight, **kw})


@pytest.mark.parametrize("answer,completion,want", [
    ("68", "68", 1.0),
    ("68", "23 + 45 = 68", 1.0),
    ("68", "The answer is 68.", 1.0),
    ("68", "I think \\boxed{68} is it", 1.0),
    ("68", "Answer: 68\nbecause 60 + 8 = 68", 1.0),
    ("68", "68.0", 1.0),
    ("1234", "1,234", 1.0),
    ("-27", "31 - 58 = -27", 1.0),
    ("68", "69", 0.0),
    ("68", "sixty-eight", 0.0),
    ("68", "", 0.0),
    ("68", "\\boxed{67} then 68", 0.0),   # the boxed answer wins
    ("ab", "ab", 1.0),
    ("ab", "ab\nxyz", 1.0),
    ("ab", "ab. more", 1.0),
    ("ab", "  AB  ", 1.0),
    ("ab", "abc", 0.0),
    ("ab", "ab\x06\ufffd", 1.0),      # a char model's garbage after the answer ends the word
    ("a-b", "a-b!", 1.0),              # the reference's own characters belong to the word
    ("ab", "ab-c", 1.0),
    ("ab", "a", 0.0),
    ("ab", "\nba", 0.0),
    ("Paris", "paris, France", 1.0),
    ("New York", "new  york.", 1.0),
    ("New York", "New", 0.0),
])
def test_exact_answer(answer: str, completion: str, want: float) -> None:
    assert exact.ExactAnswer().score(prompt(answer), [completion]) == [want]


def test_exact_answer_partial_credit() -> None:
    v = exact.ExactAnswer(partial_credit=True)
    assert v.score(prompt("ab"), ["ab", "a", "ax", "xb", ""]) == [1.0, 0.25, 0.25, 0.0, 0.0]
    assert v.score(prompt("68"), ["67"]) == [0.0]  # numbers: no partial credit


def test_extract_helpers() -> None:
    assert extract.boxed("x \\boxed{\\frac{1}{2}} y") == "\\frac{1}{2}"
    assert extract.boxed("\\boxed{unclosed") is None
    assert extract.number("1,000") == extract.number("1000.0")
    assert extract.number("12a") is None
    assert extract.normalise(' "Hello   World." ') == "hello world"


@pytest.mark.parametrize("answer,completion,want", [
    ("1/2", "The answer is $\\frac{1}{2}$", 1.0),
    ("0.5", "\\boxed{\\frac{1}{2}}", 1.0),
    ("68", "so we get 68", 1.0),
    ("x^2+2x+1", "$(x+1)^2$", 1.0),
    ("68", "69", 0.0),
    ("68", "no idea", 0.0),
])
def test_math_equivalence(answer: str, completion: str, want: float) -> None:
    assert math_equivalence.MathEquivalence().score(prompt(answer), [completion]) == [want]


def test_math_equivalence_off_main_thread() -> None:
    out: list[list[float]] = []
    t = threading.Thread(target=lambda: out.append(
        math_equivalence.MathEquivalence().score(prompt("3"), ["1+2 = 3", "4"])))
    t.start()
    t.join(60)
    assert out == [[1.0, 0.0]]


def test_regex() -> None:
    search = regex.Regex(pattern=r"^\s*-?\d+\s*$")
    assert search.score(prompt(""), ["68", " -3 \n", "68 apples", ""]) == [1.0, 1.0, 0.0, 0.0]
    full = regex.Regex(pattern=r"a+", full_match=True)
    partial = regex.Regex(pattern=r"a+")
    assert full.score(prompt(""), ["aaa", "baaa"]) == [1.0, 0.0]
    assert partial.score(prompt(""), ["aaa", "baaa"]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="fmt: regex.pattern: invalid regular expression"):
        verifiers.build(vspec("fmt", "Regex", regex={"pattern": "(unclosed"}))


def test_registry_covers_every_type() -> None:
    assert set(verifiers.REGISTRY) == {t.value for t in rljob.VerifierType}
    assert isinstance(verifiers.build(vspec("a", "ExactAnswer")), exact.ExactAnswer)
    assert isinstance(verifiers.build(vspec("m", "MathEquivalence")), math_equivalence.MathEquivalence)
    assert isinstance(verifiers.build(vspec("r", "Regex", regex={"pattern": "x"})), regex.Regex)


class Counting:
    """A verifier that records its calls (batch sizes)."""

    def __init__(self, scores: dict[str, float]) -> None:
        self.scores = scores
        self.calls: list[int] = []

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        self.calls.append(len(completions))
        return [self.scores.get(c, 0.0) for c in completions]


class Broken:
    def __init__(self, result: object) -> None:
        self.result = result

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result  # type: ignore[return-value]


SPECS = [vspec("answer", "ExactAnswer", 1.0), vspec("format", "Regex", 0.25, regex={"pattern": r"^\d+$"})]


def test_score_group_weighted_sum() -> None:
    rewards, scores = verifiers.score_group(SPECS, group("68", ["68", "23+45=68", "69", "x"]))
    assert scores == {"answer": [1.0, 1.0, 0.0, 0.0], "format": [1.0, 0.0, 1.0, 0.0]}
    assert rewards == [1.25, 1.0, 0.25, 0.0]


def test_scorer_batches_and_caches() -> None:
    a, f = Counting({"a": 1.0}), Counting({"a": 1.0, "b": 1.0})
    s = verifiers.Scorer(SPECS, verifiers={"answer": a, "format": f})
    g = group("a", ["a", "b", "c", "a"])
    assert s.score_group(g) == ([1.25, 0.25, 0.0, 1.25], {"answer": [1.0, 0.0, 0.0, 1.0],
                                                          "format": [1.0, 1.0, 0.0, 1.0]})
    assert a.calls == [3] and f.calls == [3]  # one batched call per verifier per group; "a" twice scored once
    s.score_group(group("a", ["a", "b", "d"]))  # only "d" is new
    assert a.calls == [3, 1] and f.calls == [3, 1]
    s.score_group(group("b", ["a"]))  # another reference answer: not a cache hit
    assert a.calls == [3, 1, 1]
    assert s.cache_hits == 2 * 2
    assert s.apply(g) is g and g.rewards == [1.25, 0.25, 0.0, 1.25] and a.calls == [3, 1, 1]


def test_cache_is_bounded() -> None:
    a = Counting({})
    s = verifiers.Scorer(SPECS[:1], verifiers={"answer": a}, cache_size=2)
    for t in ["x", "y", "z", "x"]:
        s.score_group(group("a", [t]))
    assert a.calls == [1, 1, 1, 1]  # "x" was evicted


@pytest.mark.parametrize("bad", [RuntimeError("boom"), [1.0], [math.nan, 1.0], ["1", None]])
def test_a_failing_verifier_scores_zero_and_is_counted(bad: object) -> None:
    s = verifiers.Scorer(SPECS, verifiers={"answer": Broken(bad)})
    rewards, scores = s.score_group(group("68", ["68", "6"]))
    assert scores["answer"] == [0.0, 0.0] and scores["format"] == [1.0, 1.0]
    assert rewards == [0.25, 0.25]
    assert s.errors == {"answer": 1}
    s.score_group(group("68", ["68", "6"]))
    assert s.errors == {"answer": 2}  # failures are not cached


def test_scorer_needs_a_verifier() -> None:
    with pytest.raises(ValueError, match="spec.verifiers"):
        verifiers.Scorer([])
