"""CodeExecution: run each completion's Python code against the record's tests in the sandbox.

Neighbours: ``registry`` builds it for ``type: CodeExecution``; ``sandbox.Sandbox`` runs one completion; the
``code`` task (``tasks/code.py``) writes records whose reference answer is their tests.

Contract: the reference answer holds the tests, one Python statement per line (usually ``assert f(2) == 4``);
blank lines and ``#`` comments are skipped. The completion's code is the first fenced block (```` ```python ````
or ```` ``` ````) when it has one, else the whole completion. Score: the fraction of tests that pass
(``partialCredit``), else 1 only when all pass. A run that times out, crashes, or is stopped by a limit scores 0:
the completion failed, the verifier did not. The group's completions run ``parallelism`` at a time: in the local
sandbox, or, when the job has ``spec.sandbox``, each in a lease of the sandbox pods (claimed, run, released:
``sandboxes.client``; docs/sandboxes.md).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import re
import sys
from typing import Sequence

from kubeforge.api import rljob
from kubeforge.runtime import types
from kubeforge.runtime.sandboxes import client
from kubeforge.runtime.verifiers import sandbox

_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
_warned = False


def program(completion: str) -> str:
    """The code of a completion: its first fenced block, else all of it."""
    m = _FENCE.search(completion)
    return m.group(1) if m else completion


def tests_of(reference: str) -> list[str]:
    return [ln.strip() for ln in reference.splitlines() if ln.strip() and not ln.strip().startswith("#")]


class CodeExecution:
    def __init__(self, settings: rljob.CodeExecutionVerifier, *, pool: client.Pool | None = None) -> None:
        global _warned
        self.settings = settings
        self.parallelism = settings.parallelism or os.cpu_count() or 1
        self.limits = sandbox.Limits(
            timeout_s=settings.timeout_seconds, memory_mib=settings.memory_mi_b,
            max_processes=settings.max_processes, max_file_mib=settings.max_file_mi_b)
        self.sandbox = sandbox.Sandbox(self.limits, concurrent=self.parallelism)
        self.pool = pool if pool is not None else client.from_env()
        self.status: collections.Counter[str] = collections.Counter()
        if not _warned:
            _warned = True
            where = (f"the job's sandbox pods ({len(self.pool.bases)})" if self.pool is not None
                     else f"this pod: {', '.join(sandbox.mechanisms())}")
            print(f"verifier: CodeExecution runs in {where}", file=sys.stderr, flush=True)

    def score(self, prompt: types.Prompt, completions: Sequence[str]) -> list[float]:
        tests = tests_of(prompt.answer)
        if not tests:
            raise ValueError(f"prompt {prompt.index}: the reference answer has no tests")
        if len(completions) == 1 or self.parallelism == 1:
            return [self._one(c, tests) for c in completions]
        with cf.ThreadPoolExecutor(max_workers=min(self.parallelism, len(completions))) as ex:
            return list(ex.map(lambda c: self._one(c, tests), completions))

    def _one(self, completion: str, tests: list[str]) -> float:
        if self.pool is not None:       # one lease per completion: its episode's sandbox
            episode = client.Episode(self.pool, self.limits)
            try:
                r = episode.run(program(completion), tests)
            finally:
                episode.close()
        else:
            r = self.sandbox.run(program(completion), tests)
        self.status[r.status] += 1
        if r.status != "ok" or r.total == 0:
            return 0.0
        if self.settings.partial_credit:
            return r.passed / r.total
        return 1.0 if r.passed == r.total else 0.0
