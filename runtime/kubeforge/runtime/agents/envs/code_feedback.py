"""``CodeFeedback``: write code, see the sandboxed test results, fix it.

The task's reference answer holds the tests (``spec.task.code`` or a jsonl task, one assert per line, as for the
``CodeExecution`` verifier). Each policy turn's code runs in the CodeExecution sandbox (``verifiers.sandbox``:
namespaces, rlimits, Landlock where available), or, when the job has ``spec.sandbox``, in a sandbox pod's lease
(``sandboxes.client.Episode``: claimed at the first turn, released when the episode closes; docs/sandboxes.md); all
tests passing ends the episode with reward 1.0, otherwise the
environment answers with the pass count (and the first error) and the policy tries again; when the turns run out the
reward is the last turn's share of passed tests.
"""
from __future__ import annotations

from kubeforge.runtime import types
from kubeforge.runtime.agents.protocol import StepResult
from kubeforge.runtime.sandboxes import client
from kubeforge.runtime.verifiers import code, sandbox

ERROR_CHARS = 300


class CodeFeedback:
    def __init__(self, *, limits: sandbox.Limits | None = None, pool: client.Pool | None = None) -> None:
        lim = limits or sandbox.Limits(timeout_s=5.0)
        pool = pool if pool is not None else client.from_env()
        self.sandbox: sandbox.Sandbox | client.Episode = (
            client.Episode(pool, lim) if pool is not None else sandbox.Sandbox(lim))
        self.tests: list[str] = []

    def close(self) -> None:
        """The episode ended: its sandbox lease (if any) goes back to the pool."""
        if isinstance(self.sandbox, client.Episode):
            self.sandbox.close()

    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        self.tests = code.tests_of(prompt.answer)
        return [{"role": "user", "content": prompt.text}]

    def step(self, assistant_text: str) -> StepResult:
        r = self.sandbox.run(code.program(assistant_text), self.tests)
        total = max(r.total, len(self.tests), 1)
        share = r.passed / total if r.status == "ok" else 0.0
        if r.status == "ok" and r.passed == total:
            return StepResult(observation=[], done=True, reward=1.0, tool_calls=1)
        why = (r.error or r.status)[:ERROR_CHARS]
        return StepResult(observation=f"Tests passed: {r.passed}/{total}. {why}\nFix the code.", done=False,
                          reward=share, tool_calls=1, tool_errors=0 if r.status == "ok" else 1)
