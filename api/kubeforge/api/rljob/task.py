"""Where prompts and reference answers come from (``spec.task``), and the held-out evaluation drawn from the same
stream (``spec.evaluation``)."""
from __future__ import annotations

import enum

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import Model, cel, schema_extra


class ArithmeticOp(str, enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"


class ArithmeticTask(Model):
    """Procedural arithmetic: 'a op b', the answer is the integer result."""

    digits: int = Field(2, ge=1, le=6, description="Digits per operand.")
    operations: list[ArithmeticOp] = Field(
        default_factory=lambda: [ArithmeticOp.ADD, ArithmeticOp.SUB], min_length=1, max_length=3,
        description="Operations to draw from.")


class CopyTask(Model):
    """Procedural copying: the prompt shows a short string, the answer is that string repeated back.

    A task a random tiny model can learn in minutes; used by tests and the tiny example."""

    length: int = Field(1, ge=1, le=16, description="Characters to copy.")
    alphabet: str = Field("abcd", min_length=2, max_length=64, description="Characters to draw from.")


class JsonlTask(Model):
    """Prompts and reference answers from a JSON-lines file."""

    path: str = Field(min_length=1, description="Path of the JSONL file (a mounted volume on a cluster).")
    prompt_field: str = Field("prompt", min_length=1, description="Key of the prompt in each record.")
    answer_field: str = Field("answer", min_length=1, description="Key of the reference answer in each record.")


class CodeFunction(str, enum.Enum):
    ADD = "Add"
    MULTIPLY = "Multiply"
    MAX = "Max"
    REVERSE = "Reverse"
    COUNT = "Count"
    PARITY = "Parity"


class CodeTask(Model):
    """Procedural code: write a small Python function; the reference answer is its tests (one assert per line),
    run by a CodeExecution verifier."""

    functions: list[CodeFunction] = Field(
        default_factory=lambda: [CodeFunction.ADD, CodeFunction.MULTIPLY, CodeFunction.MAX],
        min_length=1, max_length=6, description="Function families to draw from: Add | Multiply | Max | Reverse | "
        "Count | Parity.")
    tests: int = Field(4, ge=1, le=32, description="Test cases (asserts) per problem.")


MSG_ONE_TASK = "exactly one of arithmetic, copy, jsonl or code must be set"


class TaskSpec(Model):
    """Where prompts and reference answers come from. Exactly one source."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(
            cel("[has(self.arithmetic), has(self.copy), has(self.jsonl), has(self.code)].filter(x, x).size() == 1",
                 MSG_ONE_TASK),
        )
    )

    arithmetic: ArithmeticTask | None = Field(None, description="Procedural arithmetic problems.")
    copy_: CopyTask | None = Field(None, alias="copy", description="Procedural copy task (tests, tiny model).")
    jsonl: JsonlTask | None = Field(None, description="A JSONL file of prompts and answers.")
    code: CodeTask | None = Field(None, description="Procedural code problems with tests (for CodeExecution).")
    seed: int = Field(0, ge=0, description="Seed of the prompt stream; with the data cursor it fixes every prompt.")
    chat_template: bool = Field(
        True, description="Wrap prompts in the model's chat template when it has one.")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> TaskSpec:
        if sum(x is not None for x in (self.arithmetic, self.copy_, self.jsonl, self.code)) != 1:
            raise ValueError(MSG_ONE_TASK)
        return self


class EvaluationSpec(Model):
    """Held-out evaluation: greedy answers to prompts the policy never trains on, from the same task source."""

    every_steps: int = Field(10, ge=1, le=10_000_000, description="Evaluate after every this many optimizer steps "
                             "(and before the first step and after the last).")
    prompts: int = Field(64, ge=1, le=10_000, description="Held-out prompts per evaluation (the same ones each "
                         "time).")
    first_index: int = Field(1 << 40, ge=0, le=1 << 50, description="Index of the first held-out prompt in the task "
                             "stream; training uses indices below promptsPerStep * steps (arithmetic/copy streams "
                             "are procedural, so these prompts are new; a JSONL file wraps around).")
    max_new_tokens: int | None = Field(None, ge=1, le=131072, description="Greedy tokens per answer; default "
                                       "algorithm.maxNewTokens.")
    verifier: str | None = Field(None, min_length=1, max_length=63, description="Name of the verifier that decides "
                                 "correctness (score >= 0.5); default the first in spec.verifiers.")
