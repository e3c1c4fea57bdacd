"""Prompts and answers from a JSON-lines file, visited in a seeded order, epoch after epoch.

Neighbours: ``registry`` builds it from ``TaskSpec.jsonl`` (the file is a mounted volume in a pod, a local path in
``kubeforge run``).

Invariants:
- The file is read and validated once per stream: every non-blank line is a JSON object whose prompt field is a
  non-empty string and whose answer field is a string or a number; a violation raises ``TaskError`` naming the
  file, the line number and the field.
- Item k is record ``order(epoch)[k % n]`` with ``epoch = k // n`` and ``order`` a permutation seeded by
  (seed, epoch): every record once per epoch; a pure function of (file contents, spec, seed, k).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import random

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.tasks import base
from kubeforge.runtime.tasks.base import TaskError

MAX_RECORDS = 10_000_000


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    prompt: str
    answer: str


def load(path: pathlib.Path, *, prompt_field: str, answer_field: str) -> tuple[Record, ...]:
    """Read and validate every record of a JSONL file."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"spec.task.jsonl.path: cannot read {path}: {e}") from None
    records = [_record(line, path, n, prompt_field, answer_field) for n, line in enumerate(lines, 1) if line.strip()]
    if not records:
        raise TaskError(f"spec.task.jsonl.path: {path} has no records")
    if len(records) > MAX_RECORDS:
        raise TaskError(f"spec.task.jsonl.path: {path} has more than {MAX_RECORDS} records")
    return tuple(records)


def _record(line: str, path: pathlib.Path, n: int, prompt_field: str, answer_field: str) -> Record:
    where = f"{path}:{n}"
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise TaskError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise TaskError(f"{where}: expected a JSON object")
    prompt = obj.get(prompt_field)
    if not isinstance(prompt, str) or not prompt:
        raise TaskError(f"{where}: field {prompt_field!r} (spec.task.jsonl.promptField) must be a non-empty string")
    answer = obj.get(answer_field)
    if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
        raise TaskError(f"{where}: field {answer_field!r} (spec.task.jsonl.answerField) must be a string or number")
    return Record(prompt=prompt, answer=str(answer))



@dataclasses.dataclass(frozen=True, kw_only=True)
class JsonlStream:
    """Records of one file in a seeded order per epoch."""

    records: tuple[Record, ...]
    seed: int

    @classmethod
    def from_spec(cls, spec: rljob.JsonlTask, *, seed: int) -> JsonlStream:
        records = load(pathlib.Path(spec.path), prompt_field=spec.prompt_field, answer_field=spec.answer_field)
        return cls(records=records, seed=seed)

    def prompt_at(self, k: int) -> types.Prompt:
        if k < 0:
            raise TaskError(f"prompt index must be >= 0, got {k}")
        epoch, pos = divmod(k, len(self.records))
        rec = self.records[_order(self.seed, epoch, len(self.records))[pos]]
        return types.Prompt(index=k, text=rec.prompt, answer=rec.answer)


@functools.lru_cache(maxsize=4)
def _order(seed: int, epoch: int, n: int) -> tuple[int, ...]:
    order = list(range(n))
    random.Random(base.rng_for(seed, epoch, "jsonl-epoch").getrandbits(64)).shuffle(order)
    return tuple(order)
