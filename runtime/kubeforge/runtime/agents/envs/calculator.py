"""``Calculator``: arithmetic beyond the model's reach (e.g. 3-4 digit multiplication) with a calculator tool.

The task's prompt is the problem (``spec.task.arithmetic``), its answer the reference. A turn without a tool call
is the final answer: reward 1.0 when its last number equals the reference, else 0.0. The episode opens with one
worked exchange (the demonstration) so that an untrained small model calls the tool at all. An invalid expression is
answered with the evaluator's error and counted as a tool error.

Two ways to call the tool (``spec.environment.toolFormat``):
- ``Tags``: the policy writes ``<tool>EXPR</tool>`` and gets ``<result>VALUE</result>`` (``<error>WHY</error>``) as
  the next user turn (``tags``: any model can learn it).
- ``Native``: the tool is the function :data:`TOOLS` describes, rendered by the model's chat template; ``step`` is
  given the runner's reading of the turn in the model's own tool-call format (``protocol.native_turn``) and answers
  each call with a ``tool`` message holding the value (or ``error: WHY``).
"""
from __future__ import annotations

from typing import Any

from kubeforge.runtime import types
from kubeforge.runtime.agents import protocol
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

FUNCTION = "calculate"
TOOLS: tuple[dict[str, Any], ...] = ({"type": "function", "function": {
    "name": FUNCTION,
    "description": "Evaluate an arithmetic expression: integers, + - * / // % ** and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description":
                                                                   "The expression, e.g. 314 * 27."}},
                   "required": ["expression"]}}},)
NATIVE_SYSTEM = "You can use a calculator. When you know the answer, reply with the number only."


def _worked(a: int, b: int) -> tuple[dict[str, str], ...]:
    """One worked exchange with a native call (the runner expands the call for the template)."""
    expression, value = f"{a} * {b}", str(a * b)
    return ({"role": "user", "content": f"What is {expression}? Answer with the number only."},
            protocol.assistant_tool_calls([(FUNCTION, {"expression": expression})]),
            {"role": "tool", "content": value}, {"role": "assistant", "content": value})


# Two worked exchanges, the calls in the model's own format. With one (the Tags demonstration's) the untrained
# SmolLM2-135M-Instruct never wrote a call: after its long tools preamble it copied the <tool_response> block
# instead (0 of 16 greedy and 0 of 32 sampled first turns at temperature 1.0, held-out problems of
# examples/tool-calculator.yaml), the whole right call's probability ~1e-4. With two it is 0.07-0.11 (four held-out
# problems, bench/probes/native_call_odds.py; greedy still writes no call: the untrained model scores ~0), so GRPO
# gets groups with different rewards; with three it is 0.26-0.38 and the untrained model would already call
# greedily. The numbers are fixed, not from the task stream.
NATIVE_DEMONSTRATION: tuple[dict[str, str], ...] = (*_worked(314, 27), *_worked(52, 608))


class Calculator:
    def __init__(self, *, native: bool = False) -> None:
        self.answer = ""
        self.native = native

    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        self.answer = prompt.answer.strip()
        system, demo = (NATIVE_SYSTEM, NATIVE_DEMONSTRATION) if self.native else (SYSTEM, DEMONSTRATION)
        return [{"role": "system", "content": system}, *demo, {"role": "user", "content": prompt.text}]

    def step(self, assistant_text: str) -> StepResult:
        if self.native:
            return self._native_step(assistant_text)
        call = tags.tool_call(assistant_text)
        if call is None:
            return self._final(assistant_text)
        try:
            value = tags.result(arith.show(arith.evaluate(call)))
        except arith.ArithmeticError_ as e:
            return StepResult(observation=tags.error(str(e)), done=False, tool_calls=1, tool_errors=1)
        return StepResult(observation=value, done=False, tool_calls=1)

    def _native_step(self, message: str) -> StepResult:
        content, calls = protocol.native_turn(message)
        if not calls:
            return self._final(content)
        answers, errors = [], 0
        for call in calls:
            try:
                value = arith.show(arith.evaluate(_expression(call)))
            except arith.ArithmeticError_ as e:
                value, errors = f"error: {e}", errors + 1
            answers.append({"role": "tool", "content": value})
        return StepResult(observation=answers, done=False, tool_calls=len(calls), tool_errors=errors)

    def _final(self, text: str) -> StepResult:
        final = tags.last_number(text)
        return StepResult(observation=[], done=True, reward=1.0 if final == self.answer else 0.0)


def _expression(call: protocol.ToolCall) -> str:
    expression = call.arguments.get("expression")
    if call.name != FUNCTION or not isinstance(expression, str):
        raise arith.ArithmeticError_(f'call {FUNCTION} with {{"expression": "..."}}')
    return expression


def make_env() -> Calculator:
    return Calculator()
