"""A test environment written against PrimeIntellect's ``verifiers`` library (0.4.x, ``verifiers.v1``) only: a
taskset of number-guessing tasks, a two-turn chat harness on the ``openai`` client, and a reward on the final
transcript. Nothing here imports kubeforge: kubeforge runs it unchanged (``spec.environment.type: Verifiers``,
``verifiers: {environment: vf_guess}``) through its OpenAI-compatible endpoint."""
from __future__ import annotations

from collections.abc import Iterable

import verifiers.v1 as vf
from openai import AsyncOpenAI

TURNS = 2

__all__ = ["GuessTaskset", "GuessHarness"]


class GuessTask(vf.Task):
    @vf.reward
    async def answered_with_a_digit(self, trace: vf.Trace) -> float:
        """1.0 when the last assistant message holds a digit, else 0.0."""
        last = [m for m in trace.messages if getattr(m, "role", "") == "assistant"]
        text = str(getattr(last[-1], "content", "") or "") if last else ""
        return float(any(ch.isdigit() for ch in text))


class GuessConfig(vf.TasksetConfig):
    tasks: int = 4
    """How many tasks the taskset yields (``spec.environment.verifiers.args: {tasks: N}``)."""


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterable[GuessTask]:
        for i in range(self.config.tasks):
            yield GuessTask(vf.TaskData(prompt=f"Guess my number {i}:"))


class GuessHarnessConfig(vf.HarnessConfig):
    pass


class GuessHarness(vf.Harness[GuessHarnessConfig]):
    """Two turns: ask, read the reply, say "higher", read again. Runs in the library's own process."""

    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=120)
        messages = [{"role": "user", "content": data.prompt_text}]
        for turn in range(TURNS):
            r = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=8)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "higher"}]
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")
