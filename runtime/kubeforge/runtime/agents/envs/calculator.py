"""``Calculator``: arithmetic beyond the model's reach (e.g. 3-4 digit multiplication) with a calculator tool.

The task's prompt is the problem (``spec.task.arithmetic``), its answer the reference. A policy turn with
``<tool>EXPR</tool>`` gets ``<result>VALUE</result>`` (``arith``: safe, no eval) and goes on; a turn without a
tool call is the final answer: reward 1.0 when its last number equals the reference, else 0.0. The episode opens
with one worked exchange (``DEMONSTRATION``) so that an untrained small model calls the tool at all. An invalid
expression is answered with ``<error>…</error>`` and counted as a tool error.
"""
from __future__ import annotations

from kubeforge.runtime import types
from kubeforge.runtime.agents.envs import arith, tags
from kubeforge.runtime.agents.protocol import StepResult

SYSTEM = ("You can use a calculator. To compute, write <tool>EXPRESSION</tool> and wait for <result>VALUE</result>. "
          "When you know the answer, reply with the number only.")
# One worked exchange before the problem. Without it the untrained SmolLM2-135M-Instruct never wrote the tag (0 of 32
# sampled first turns, temperature 0.8, 8 problems of examples/tool-calculator.yaml); with it 9 of 32 did, so GRPO
# has groups with different rewards to learn from. The numbers are fixed, not from the task stream.
DEMONSTRATION: tuple[dict[str, str], ...] = (
    {"role": "user", "content": "What is 314 * 27? Answer with the number only."},
    {"role": "assistant", "content": "<tool>314 * 27</tool>"},
    {"role": "user", "content": "<result>8478</result>"},
    {"role": "assistant", "content": "8478"},
)
STOP = tags.STOP


class Calculator:
    def __init__(self) -> None:
        self.answer = ""

    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        self.answer = prompt.answer.strip()
        return [{"role": "system", "content": SYSTEM}, *DEMONSTRATION, {"role": "user", "content": prompt.text}]

    def step(self, assistant_text: str) -> StepResult:
        call = tags.tool_call(assistant_text)
        if call is None:
            final = tags.last_number(assistant_text)
            return StepResult(observation=[], done=True, reward=1.0 if final == self.answer else 0.0)
        try:
            value = tags.result(arith.show(arith.evaluate(call)))
        except arith.ArithmeticError_ as e:
            return StepResult(observation=tags.error(str(e)), done=False, tool_calls=1, tool_errors=1)
        return StepResult(observation=value, done=False, tool_calls=1)


def make_env() -> Calculator:
    return Calculator()
