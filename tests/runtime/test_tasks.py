"""tasks: determinism (a pure function of spec, seed and k), formats and answers, JSONL validation."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from kubeforge.api import rljob
from kubeforge.runtime import tasks


def spec(**kw: object) -> rljob.TaskSpec:
    return rljob.TaskSpec.model_validate(kw)


ARITH = spec(arithmetic={"digits": 2, "operations": ["+", "-", "*"]}, seed=7)
COPY = spec(copy={"length": 3, "alphabet": "xyz"}, seed=1)


@pytest.mark.parametrize("s", [ARITH, COPY], ids=["arithmetic", "copy"])
def test_prompt_at_is_pure(s: rljob.TaskSpec) -> None:
    a, b = tasks.stream(s), tasks.stream(s)
    assert [a.prompt_at(k) for k in range(50)] == [b.prompt_at(k) for k in reversed(range(50))][::-1]
    assert tasks.prompt_at(s, 12345) == a.prompt_at(12345)
    assert all(a.prompt_at(k).index == k for k in (0, 1, 10**12))
    other = tasks.stream(s.model_copy(update={"seed": s.seed + 1}))
    assert [a.prompt_at(k) for k in range(20)] != [other.prompt_at(k) for k in range(20)]
    with pytest.raises(tasks.TaskError):
        a.prompt_at(-1)


def test_prompt_at_is_the_same_in_another_process() -> None:
    code = ("from kubeforge.api import rljob; from kubeforge.runtime import tasks; "
            "s = rljob.TaskSpec.model_validate({'arithmetic': {'digits': 2, 'operations': ['+', '-', '*']}, 'seed': 7});"
            "print(repr([tasks.prompt_at(s, k) for k in range(5)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123"}).stdout.strip()
    assert out == repr([tasks.prompt_at(ARITH, k) for k in range(5)])


def test_arithmetic_answers_are_right() -> None:
    s = tasks.stream(ARITH)
    ops = set()
    for k in range(300):
        p = s.prompt_at(k)
        expr = p.text.removeprefix("What is ").split("?")[0]
        a, op, b = expr.split()
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert int(p.answer) == eval(expr)  # noqa: S307 (our own generated "a op b")
        ops.add(op)
    assert ops == {"+", "-", "*"}


def test_arithmetic_one_digit_and_single_op() -> None:
    s = tasks.stream(spec(arithmetic={"digits": 1, "operations": ["*"]}))
    seen = {s.prompt_at(k).text.split()[2] for k in range(200)}
    assert "0" in seen and "9" in seen and all(len(x) == 1 for x in seen)


def test_copy_format() -> None:
    s = tasks.stream(COPY)
    answers = set()
    for k in range(100):
        p = s.prompt_at(k)
        assert p.text == f"copy: {p.answer}"
        assert len(p.answer) == 3 and set(p.answer) <= set("xyz")
        answers.add(p.answer)
    assert len(answers) > 10


def write(tmp: pathlib.Path, lines: list[str]) -> pathlib.Path:
    path = tmp / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_jsonl_epochs_cover_every_record(tmp_path: pathlib.Path) -> None:
    path = write(tmp_path, [json.dumps({"q": f"question {i}", "a": i}) for i in range(10)] + [""])
    s = tasks.stream(spec(jsonl={"path": str(path), "promptField": "q", "answerField": "a"}, seed=3))
    epoch0 = [s.prompt_at(k) for k in range(10)]
    epoch1 = [s.prompt_at(k) for k in range(10, 20)]
    assert sorted(p.text for p in epoch0) == sorted(f"question {i}" for i in range(10))
    assert sorted(p.text for p in epoch1) == sorted(p.text for p in epoch0)
    assert [p.text for p in epoch0] != [p.text for p in epoch1]  # reshuffled per epoch
    assert all(p.answer == p.text.split()[-1] for p in epoch0)
    assert [p.index for p in epoch1] == list(range(10, 20))
    again = tasks.stream(spec(jsonl={"path": str(path), "promptField": "q", "answerField": "a"}, seed=3))
    assert [again.prompt_at(k) for k in range(20)] == epoch0 + epoch1


@pytest.mark.parametrize("lines,needle", [
    (["not json"], ":1: not JSON"),
    (['{"prompt": "p", "answer": "a"}', "[1, 2]"], ":2: expected a JSON object"),
    (['{"prompt": "", "answer": "a"}'], "'prompt' (spec.task.jsonl.promptField)"),
    (['{"prompt": "p"}'], "'answer' (spec.task.jsonl.answerField)"),
    (['{"prompt": "p", "answer": true}'], "answerField"),
    ([""], "has no records"),
])
def test_jsonl_errors_name_line_and_field(tmp_path: pathlib.Path, lines: list[str], needle: str) -> None:
    path = write(tmp_path, lines)
    with pytest.raises(tasks.TaskError, match=None) as e:
        tasks.stream(spec(jsonl={"path": str(path)}))
    assert needle in str(e.value)


def test_jsonl_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(tasks.TaskError, match="spec.task.jsonl.path: cannot read"):
        tasks.stream(spec(jsonl={"path": str(tmp_path / "nope.jsonl")}))


def test_batch_is_one_steps_prompts() -> None:
    s = tasks.stream(COPY)
    b = tasks.batch(s, start=16, count=8)
    assert [p.index for p in b] == list(range(16, 24))
    assert b == [s.prompt_at(k) for k in range(16, 24)]
    assert tasks.kind_of(COPY) == "copy" and tasks.kind_of(ARITH) == "arithmetic"
