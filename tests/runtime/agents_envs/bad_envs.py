"""Environments for the host tests: each step does what the policy's text says (raise, hang, garbage, flood), else
echoes the text back and counts turns; deterministic, so a replay after a worker restart rebuilds its state."""
from __future__ import annotations

import time
from typing import Any

from kubeforge.runtime import types
from kubeforge.runtime.agents.protocol import StepResult


class Echo:
    def __init__(self) -> None:
        self.turns = 0

    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"echo {prompt.text}"}]

    def step(self, text: str) -> Any:
        self.turns += 1
        if text == "raise":
            raise RuntimeError("the environment broke")
        if text == "hang":
            time.sleep(3600)
        if text == "garbage":
            return 42
        if text == "flood":
            return StepResult(observation="x" * (8 << 20), done=False)
        if text == "print":
            print("noise on stdout must not corrupt the channel")
        return StepResult(observation=f"turn {self.turns}: {text}", done=text == "done", reward=float(self.turns),
                          tool_calls=1)


def make_env() -> Echo:
    return Echo()
