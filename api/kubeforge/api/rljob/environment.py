"""Multi-turn environments (``spec.environment``): episodes of policy and environment turns
(docs/agents.md)."""
from __future__ import annotations

import enum
from typing import Any

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import ENTRY_POINT_RULE, EntryPoint, FREE_FORM, Model, cel, schema_extra


class EnvironmentType(str, enum.Enum):
    CALCULATOR = "Calculator"
    GUESS_NUMBER = "GuessNumber"
    CODE_FEEDBACK = "CodeFeedback"
    PYTHON = "Python"
    VERIFIERS = "Verifiers"
    AGENT = "Agent"         # the user's agent program in agent pods (spec.agent) drives each episode


class ToolFormat(str, enum.Enum):
    """See docs/agents.md, "Tool calls"."""

    TAGS = "Tags"       # <tool>EXPR</tool>, answered <result>VALUE</result>: any model can learn it
    NATIVE = "Native"   # the model's own tool-call format through its chat template; results as tool messages


class EnvironmentReward(str, enum.Enum):
    """Where an episode's reward comes from (docs/agents.md, "Reward")."""

    ENVIRONMENT = "Environment"   # the environment's own reward (0 when it gave none); spec.verifiers only logged
    VERIFIERS = "Verifiers"       # spec.verifiers over the episode's transcript, as for a single-turn completion
    BOTH = "Both"                 # the verifiers' aggregated reward plus the environment's


class PythonEnvironment(Model):
    """A user's environment: ``make_env()`` on the image's Python path returns one object per episode with
    ``reset(prompt) -> messages`` and ``step(text) -> StepResult`` (``kubeforge.runtime.agents.protocol``)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(ENTRY_POINT_RULE))

    entry_point: EntryPoint = Field(min_length=3, max_length=512, description="'package.module:make_env'.")


MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*$"


class VerifiersEnvironment(Model):
    """An environment written for PrimeIntellect's ``verifiers`` library, run unchanged through the
    OpenAI-compatible endpoint in front of the generators (docs/agents.md)."""

    environment: str = Field(min_length=1, max_length=256, pattern=MODULE_PATTERN,
                             description="The taskset's module (verifiers 0.4: a package exporting its vf.Taskset "
                             "subclass), imported in the environments' interpreter.")
    args: dict[str, Any] = Field(default_factory=dict, description="The taskset's config fields (JSON), validated by "
                                 "the library.",
                                 json_schema_extra=FREE_FORM)


class GuessNumberEnvironment(Model):
    """Settings of the GuessNumber game: the secret lies in [1, maxValue]."""

    max_value: int = Field(16, ge=2, le=1_000_000, description="The largest secret number.")


MSG_ENV_PYTHON = "python must be set when type is Python, and only then"
MSG_ENV_VERIFIERS = "verifiers must be set when type is Verifiers, and only then"
MSG_ENV_GUESS = "guessNumber may only be set when type is GuessNumber"
MSG_ENV_AGENT_REWARD = ("reward must be Verifiers when type is Agent: an agent program reports no reward; "
                        "spec.verifiers score the episode's final reply")
MSG_ENV_NATIVE = ("toolFormat Native needs an environment whose tools are function schemas: type Calculator (the "
                  "others take Tags)")


class EnvironmentSpec(Model):
    """A multi-turn environment: each completion is an episode of policy turns (vLLM) and environment turns
    (observations, tool results) until the environment says done or a bound is hit (docs/agents.md)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(
            cel("has(self.python) == (self.type == 'Python')", MSG_ENV_PYTHON),
            cel("has(self.verifiers) == (self.type == 'Verifiers')", MSG_ENV_VERIFIERS),
            cel("!has(self.guessNumber) || self.type == 'GuessNumber'", MSG_ENV_GUESS),
            cel("!has(self.toolFormat) || self.toolFormat != 'Native' || self.type == 'Calculator'",
                MSG_ENV_NATIVE),
            cel("self.type != 'Agent' || self.reward == 'Verifiers'", MSG_ENV_AGENT_REWARD)))

    type: EnvironmentType = Field(description="Calculator | GuessNumber | CodeFeedback | Python | Verifiers | Agent "
                                  "(the user's agent program in agent pods: spec.agent).")
    max_turns: int = Field(4, ge=1, le=64, description="Policy turns per episode at most.")
    max_tokens_per_episode: int | None = Field(
        None, ge=1, le=131072, description="Tokens after the prompt per episode at most, policy and environment "
        "tokens together (default: maxTurns x maxNewTokens + 256 per environment turn).")
    turn_timeout_seconds: float = Field(10.0, gt=0, le=600, description="Time limit of one environment step; an "
                                        "overrun ends that episode (counted), the job goes on.")
    max_observation_bytes: int = Field(4096, ge=16, le=1_048_576, description="An observation longer than this "
                                       "(UTF-8 bytes) ends the episode (counted as a flood).")
    reward: EnvironmentReward = Field(EnvironmentReward.ENVIRONMENT, description="Environment (the environment's "
                                      "reward) | Verifiers (spec.verifiers over the transcript) | Both (their sum).")
    python: PythonEnvironment | None = Field(None, description="Settings for type Python.")
    verifiers: VerifiersEnvironment | None = Field(None, description="Settings for type Verifiers.")
    guess_number: GuessNumberEnvironment | None = Field(None, description="Settings for type GuessNumber.")
    tool_format: ToolFormat = Field(ToolFormat.TAGS, description="How the policy calls the tools: Tags (a tag "
                                    "protocol any model can learn) | Native (the model's own tool-call format "
                                    "through its chat template: SmolLM2's, the Hermes/Qwen2.5 family's; results come "
                                    "back as tool messages). Native: type Calculator, with a model whose template "
                                    "writes such a format.")

    @pydantic.model_validator(mode="after")
    def _settings(self) -> EnvironmentSpec:
        if (self.python is not None) != (self.type == EnvironmentType.PYTHON.value):
            raise ValueError(MSG_ENV_PYTHON)
        if (self.verifiers is not None) != (self.type == EnvironmentType.VERIFIERS.value):
            raise ValueError(MSG_ENV_VERIFIERS)
        if self.guess_number is not None and self.type != EnvironmentType.GUESS_NUMBER.value:
            raise ValueError(MSG_ENV_GUESS)
        if self.tool_format == ToolFormat.NATIVE.value and self.type != EnvironmentType.CALCULATOR.value:
            raise ValueError(MSG_ENV_NATIVE)
        if self.type == EnvironmentType.AGENT.value and self.reward != EnvironmentReward.VERIFIERS.value:
            raise ValueError(MSG_ENV_AGENT_REWARD)
        return self

    def episode_tokens(self, max_new_tokens: int) -> int:
        """The per-episode token bound in force."""
        if self.max_tokens_per_episode is not None:
            return self.max_tokens_per_episode
        return self.max_turns * max_new_tokens + (self.max_turns - 1) * 256
