"""Guess my number, written against PrimeIntellect's ``verifiers`` library (0.4.x, ``verifiers.v1``) alone: a
taskset of secrets, a multi-turn harness on the ``openai`` client that answers each guess with "higher" or "lower",
and a reward on the final transcript. Nothing here imports kubeforge; ``examples/tiny-verifiers.yaml`` trains on it
unchanged (``spec.environment: {type: Verifiers, verifiers: {environment: vf_guess_number}}``), and so would the
library's own tools (``vf-eval``-style runs against any OpenAI-compatible server).

Reward ``(turns - k + 1) / turns`` for a right guess at assistant turn k, 0.0 if no guess is right: fewer turns,
more reward (the same game as kubeforge's built-in ``GuessNumber``, so the two can be compared).
"""
from __future__ import annotations

import re
from collections.abc import Iterable

import httpx
import verifiers.v1 as vf
from openai import AsyncOpenAI

__all__ = ["GuessTaskset", "GuessHarness"]

NUMBER = re.compile(r"-?\d+")


def last_number(text: str) -> int | None:
    found = NUMBER.findall(text or "")
    return int(found[-1]) if found else None


_http: httpx.AsyncClient | None = None


def http_client() -> httpx.AsyncClient:
    """One HTTP client for every rollout of the process (a client per rollout builds a TLS context each time)."""
    global _http
    if _http is None:
        _http = httpx.AsyncClient(timeout=120)
    return _http


def hint(guess: int | None, secret: int) -> str:
    if guess is None:
        return "a number"
    return "higher" if guess < secret else "lower"


class GuessData(vf.TaskData):
    secret: int = 1
    turns: int = 2


class GuessTask(vf.Task[GuessData]):
    @vf.reward
    async def guessed(self, trace: vf.Trace) -> float:
        """``(turns - k + 1) / turns`` for the first right guess at assistant turn k, else 0.0."""
        replies = [str(getattr(m, "content", "") or "") for m in trace.messages
                   if getattr(m, "role", "") == "assistant"]
        turns = self.data.turns
        for k, text in enumerate(replies[:turns], start=1):
            if last_number(text) == self.data.secret:
                return (turns - k + 1) / turns
        return 0.0


class GuessConfig(vf.TasksetConfig):
    max_value: int = 2
    """Secrets lie in [1, max_value]."""
    tasks: int = 64
    """How many tasks (secrets ``1 + (i * 7919) % max_value``) the taskset yields."""
    turns: int = 2
    """Guesses per episode at most."""


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterable[GuessTask]:
        top = self.config.max_value
        for i in range(self.config.tasks):
            yield GuessTask(GuessData(prompt=f"Guess my number from 1 to {top}:", secret=1 + (i * 7919) % top,
                                      turns=self.config.turns))


class GuessHarnessConfig(vf.HarnessConfig):
    max_tokens: int = 8
    """Tokens per reply asked of the model (the trainer's maxNewTokens caps it too)."""


class GuessHarness(vf.Harness[GuessHarnessConfig]):
    """Ask, read the guess, answer "higher" / "lower" until it is right or the turns run out."""

    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, http_client=http_client())
        messages = [{"role": "user", "content": data.prompt_text}]
        for _ in range(data.turns):
            r = await client.chat.completions.create(model=ctx.model, messages=messages,
                                                     max_tokens=self.config.max_tokens)
            reply = r.choices[0].message.content or ""
            guess = last_number(reply)
            if guess == data.secret:
                break
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": hint(guess, data.secret)}]
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")
