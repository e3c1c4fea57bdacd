"""CodeFeedback: the policy's code runs against the task's tests in the CodeExecution sandbox; failing tests come
back as feedback, passing all of them ends the episode with reward 1.0."""
from __future__ import annotations

from kubeforge.runtime import types
from kubeforge.runtime.agents import protocol
from kubeforge.runtime.agents.envs import code_feedback

TESTS = "assert add(1, 2) == 3\nassert add(-1, 1) == 0"


def test_feedback_then_fix() -> None:
    env = code_feedback.CodeFeedback()
    start = env.reset(types.Prompt(index=0, text="Write add(a, b).", answer=TESTS))
    assert start == [{"role": "user", "content": "Write add(a, b)."}]
    wrong = protocol.check_result(env.step("```python\ndef add(a, b):\n    return a + b if a > 0 else 7\n```"))
    assert not wrong.done and wrong.tool_calls == 1
    assert isinstance(wrong.observation, list) and "Tests passed: 1/2" in wrong.observation[0]["content"]
    assert wrong.reward == 0.5
    right = protocol.check_result(env.step("```python\ndef add(a, b):\n    return a + b\n```"))
    assert right.done and right.reward == 1.0


def test_code_that_crashes_is_a_tool_error_not_a_failure() -> None:
    env = code_feedback.CodeFeedback()
    env.reset(types.Prompt(index=0, text="", answer=TESTS))
    r = protocol.check_result(env.step("raise SystemExit(3)"))
    assert not r.done and r.reward == 0.0
