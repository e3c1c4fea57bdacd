"""``GuessNumber``: a multi-turn game; the environment answers each guess with higher / lower until it is right.

The secret is the task's reference answer when that is an integer in [1, maxValue] (e.g. ``spec.task.copy`` over
the alphabet "12"), else drawn from the prompt's index. Reward ``(maxTurns - k + 1) / maxTurns`` for a right guess
at policy turn k (fewer turns, more reward), 0.0 when the turns run out; learning shows as fewer turns.
"""
from __future__ import annotations

from kubeforge.runtime import types
from kubeforge.runtime.agents.envs import tags
from kubeforge.runtime.agents.protocol import StepResult


class GuessNumber:
    def __init__(self, *, max_value: int, max_turns: int) -> None:
        self.max_value, self.max_turns = max_value, max_turns
        self.secret = 1
        self.turn = 0

    def reset(self, prompt: types.Prompt) -> list[dict[str, str]]:
        a = prompt.answer.strip()
        self.secret = int(a) if a.isdigit() and 1 <= int(a) <= self.max_value else \
            1 + (prompt.index * 7919) % self.max_value
        self.turn = 0
        return [{"role": "user", "content": f"Guess my number from 1 to {self.max_value}:"}]

    def step(self, assistant_text: str) -> StepResult:
        self.turn += 1
        guess = tags.last_number(assistant_text)
        if guess is not None and guess.lstrip("-").isdigit() and int(guess) == self.secret:
            return StepResult(observation=[], done=True,
                              reward=(self.max_turns - self.turn + 1) / self.max_turns)
        if guess is None or not guess.lstrip("-").isdigit():
            hint = "a number"
        else:
            hint = "higher" if int(guess) < self.secret else "lower"
        return StepResult(observation=hint, done=False, reward=0.0)
