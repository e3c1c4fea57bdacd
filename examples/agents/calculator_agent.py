"""A calculator agent written with the OpenAI Agents SDK, as its users write one: no kubeforge import.

It reads a question on stdin, lets the model call a `calculate` function tool, and prints the final answer. The
SDK's default client reads OPENAI_BASE_URL and OPENAI_API_KEY, and OPENAI_DEFAULT_MODEL names the model: an
RLJob's agent pod sets them to the episode's endpoint and credential (docs/agents.md, "Agents in their own pods"),
so the same file runs against any OpenAI-compatible server. Run it by hand:
    echo 'What is 715 * 266?' | OPENAI_BASE_URL=... OPENAI_API_KEY=... python calculator_agent.py
"""
from __future__ import annotations

import ast
import operator
import sys

from agents import Agent, Runner, function_tool, set_default_openai_api
from agents.exceptions import MaxTurnsExceeded

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](_eval(node.left), _eval(node.right))
    raise ValueError("only integers with + - *")


@function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with + - *, e.g. '715 * 266'."""
    try:
        return str(_eval(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError) as exc:
        return f"error: {exc}"


agent = Agent(name="calculator", tools=[calculate],
              instructions="Call the calculate tool for arithmetic, then answer with the number only.")


def main() -> int:
    set_default_openai_api("chat_completions")    # the endpoint serves chat completions (not the Responses API)
    try:
        result = Runner.run_sync(agent, sys.stdin.read(), max_turns=3)
    except MaxTurnsExceeded:
        print("(no answer within 3 turns)")
        return 0
    print(result.final_output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
