"""A test environment written against PrimeIntellect's ``verifiers`` library only: task ``i`` behaves by
``MODES[i % 3]``: ``ok`` (two calls, reward 1.0), ``hang`` (one call, then awaits forever: the rollout's timeout
must cancel it alone), ``crash`` (one call, then raises: that rollout fails alone). No kubeforge import."""
from __future__ import annotations

import asyncio
from collections.abc import Iterable

import verifiers.v1 as vf
from openai import AsyncOpenAI

__all__ = ["FlakyTaskset", "FlakyHarness"]
MODES = ("ok", "hang", "crash")


class FlakyData(vf.TaskData):
    mode: str = "ok"


class FlakyTask(vf.Task[FlakyData]):
    @vf.reward
    async def finished(self, trace: vf.Trace) -> float:
        return 1.0


class FlakyConfig(vf.TasksetConfig):
    pass


class FlakyTaskset(vf.Taskset[FlakyTask, FlakyConfig]):
    def load(self) -> Iterable[FlakyTask]:
        for i, mode in enumerate(MODES):
            yield FlakyTask(FlakyData(prompt=f"task {i}", mode=mode))


class FlakyHarness(vf.Harness[vf.HarnessConfig]):
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=60)
        messages = [{"role": "user", "content": data.prompt_text}]
        r = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=4)
        if data.mode == "hang":
            await asyncio.sleep(3600)
        if data.mode == "crash":
            raise RuntimeError("the agent crashed")
        messages += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "go"}]
        await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=4)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")
