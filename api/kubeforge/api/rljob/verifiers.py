"""The verifiers that score completions (``spec.verifiers``) and how their scores become one reward
(``spec.reward``). The runtime's verifier registry (``kubeforge.runtime.verifiers``) builds one per ``type``."""
from __future__ import annotations

import enum
import re

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_snake

from kubeforge.api.rljob.base import ENTRY_POINT_RULE, EntryPoint, NAME_PATTERN, Model, cel, schema_extra


class VerifierType(str, enum.Enum):
    EXACT_ANSWER = "ExactAnswer"
    MATH_EQUIVALENCE = "MathEquivalence"
    REGEX = "Regex"
    LENGTH = "Length"
    CODE_EXECUTION = "CodeExecution"
    REWARD_MODEL = "RewardModel"
    PYTHON = "Python"


class Isolation(str, enum.Enum):
    THREAD = "Thread"
    PROCESS = "Process"


MSG_REGEX_INVALID = "regular expression does not compile"


class RegexVerifier(Model):
    """Settings of a Regex verifier: reward 1 when the completion matches."""

    pattern: str = Field(min_length=1, max_length=4096, description="Python regular expression matched against "
                         "the completion (must compile; matching is time-limited by timeoutSeconds).")
    full_match: bool = Field(False, description="Require the whole completion to match (else search anywhere).")

    @pydantic.field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as e:
            raise ValueError(f"{MSG_REGEX_INVALID}: {e}") from None
        return v


MSG_LENGTH_RANGE = "maxChars must be greater than or equal to minChars"


class LengthVerifier(Model):
    """Settings of a Length verifier (length shaping): 1 inside [minChars, maxChars], falling linearly to 0 over
    slopeChars characters outside."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(cel("self.maxChars >= self.minChars", MSG_LENGTH_RANGE)))

    min_chars: int = Field(0, ge=0, le=10_000_000, description="Shortest completion (characters, stripped) that "
                           "scores 1.")
    max_chars: int = Field(ge=0, le=10_000_000, description="Longest completion (characters, stripped) that "
                           "scores 1.")
    slope_chars: int = Field(1, ge=1, le=10_000_000, description="Characters outside the range over which the "
                             "score falls from 1 to 0.")

    @pydantic.model_validator(mode="after")
    def _range(self) -> LengthVerifier:
        if self.max_chars < self.min_chars:
            raise ValueError(MSG_LENGTH_RANGE)
        return self


class CodeExecutionVerifier(Model):
    """Settings of a CodeExecution verifier: the completion's Python code runs against the record's tests (the
    reference answer: one `assert` statement per line) in a sandboxed subprocess; score = fraction of tests passed
    (or all-or-nothing)."""

    timeout_seconds: float = Field(5.0, gt=0, le=600, description="Wall-clock limit of one completion's run "
                                   "(the process tree is killed after it); CPU time is limited to it too.")
    memory_mi_b: int = Field(256, alias="memoryMiB", ge=32, le=65536, description="Address-space limit of the "
                             "sandboxed process, MiB.")
    max_processes: int = Field(8, ge=1, le=1024, description="Processes the sandboxed code may create.")
    max_file_mi_b: int = Field(16, alias="maxFileMiB", ge=1, le=4096, description="Largest file (and output) the "
                               "sandboxed code may write, MiB.")
    parallelism: int = Field(0, ge=0, le=256, description="Completions run at once; 0 = the CPU count.")
    partial_credit: bool = Field(True, description="Score the fraction of tests passed (else 1 only when all pass).")


class RewardModelVerifier(Model):
    """Settings of a RewardModel verifier: a Hugging Face sequence classifier scores (prompt, completion); one
    label: sigmoid of the logit; several: the softmax probability of the last label."""

    path: str = Field(min_length=1, max_length=4096, description="HF model folder (a PVC mount on a cluster).")
    max_length: int = Field(1024, ge=8, le=131072, description="Tokens of prompt + completion kept (truncated).")
    batch_size: int = Field(16, ge=1, le=4096, description="Completions per forward pass.")


class PythonVerifier(Model):
    """Settings of a Python verifier: a user's function on the image's Python path, called once per group as
    ``fn(prompt=str, reference=str, completions=list[str])`` and returning one float per completion."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(ENTRY_POINT_RULE))

    entry_point: EntryPoint = Field(min_length=3, max_length=512, description="'package.module:function'.")


MSG_REGEX_NEEDS_SETTINGS = "regex must be set when type is Regex"
MSG_LENGTH_NEEDS_SETTINGS = "length must be set when type is Length"
MSG_REWARD_MODEL_NEEDS_SETTINGS = "rewardModel must be set when type is RewardModel"
MSG_PYTHON_NEEDS_SETTINGS = "python must be set when type is Python"

# (type, settings field (wire name), message): a verifier of that type needs those settings.
_NEEDS_SETTINGS = (
    (VerifierType.REGEX, "regex", MSG_REGEX_NEEDS_SETTINGS),
    (VerifierType.LENGTH, "length", MSG_LENGTH_NEEDS_SETTINGS),
    (VerifierType.REWARD_MODEL, "rewardModel", MSG_REWARD_MODEL_NEEDS_SETTINGS),
    (VerifierType.PYTHON, "python", MSG_PYTHON_NEEDS_SETTINGS),
)


class VerifierSpec(Model):
    """One verifier; it scores a whole group of completions in one call. How scores become the reward is
    spec.reward.aggregation."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(
            *(cel(f"self.type != '{t.value}' || has(self.{f})", msg) for t, f, msg in _NEEDS_SETTINGS),
        )
    )

    name: str = Field(min_length=1, max_length=63, pattern=NAME_PATTERN,
                      description="Unique name; labels this verifier's reward metrics.")
    type: VerifierType = Field(description="ExactAnswer | MathEquivalence | Regex | Length | CodeExecution | "
                               "RewardModel | Python.")
    weight: float = Field(1.0, ge=-100, le=100, description="Weight of this verifier's score in a WeightedSum "
                          "reward (other aggregations ignore it).")
    timeout_seconds: float = Field(30.0, gt=0, le=3600, description="Time limit of one group's call; an overrun "
                                   "gives the unscored completions fallbackScore (counted).")
    fallback_score: float | None = Field(0.0, ge=-100, le=100, description="Score of a completion the verifier "
                                         "failed or ran out of time on (counted); null: it abstains (MajorityVote "
                                         "and WeakSupervision skip it, WeightedSum counts 0).")
    isolation: Isolation = Field(Isolation.THREAD, description="Thread (in the verifier process) | Process (a "
                                 "worker process, killed and restarted when it overruns timeoutSeconds).")
    regex: RegexVerifier | None = Field(None, description="Settings for type Regex.")
    length: LengthVerifier | None = Field(None, description="Settings for type Length.")
    code_execution: CodeExecutionVerifier | None = Field(None, description="Settings for type CodeExecution "
                                                         "(defaults apply when unset).")
    reward_model: RewardModelVerifier | None = Field(None, description="Settings for type RewardModel.")
    python: PythonVerifier | None = Field(None, description="Settings for type Python.")

    @pydantic.model_validator(mode="after")
    def _settings(self) -> VerifierSpec:
        for t, f, msg in _NEEDS_SETTINGS:
            if self.type == t.value and getattr(self, to_snake(f)) is None:
                raise ValueError(msg)
        return self


class Aggregation(str, enum.Enum):
    WEIGHTED_SUM = "WeightedSum"
    MAJORITY_VOTE = "MajorityVote"
    WEAK_SUPERVISION = "WeakSupervision"


MSG_POSITIVE_RATES = "maxPositiveRate must be greater than minPositiveRate"
MSG_MIN_ITEMS_WINDOW = ("minItems must be less than or equal to window: the window holds at most window completions, "
                        "so the label model would never be fitted")


class WeakSupervisionSpec(Model):
    """Weaver-style weak supervision: binarised verifier votes -> a label model -> P(correct) as the reward."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(cel("self.maxPositiveRate > self.minPositiveRate", MSG_POSITIVE_RATES),
                                        cel("self.minItems <= self.window", MSG_MIN_ITEMS_WINDOW)))

    class_balance: float | None = Field(None, gt=0, lt=1, description="Prior share of correct completions; "
                                        "estimated from the votes when unset.")
    refit_every_steps: int = Field(10, ge=1, le=1_000_000, description="Refit the label model after every this "
                                   "many optimizer steps (groups carry their step).")
    window: int = Field(4096, ge=16, le=1_000_000, description="Recent completions the label model is fitted on.")
    min_items: int = Field(64, ge=8, le=1_000_000, description="Completions needed before the first fit (until "
                           "then the reward is the mean vote).")
    threshold: float = Field(0.5, gt=0, lt=1, description="A normalised score at or above it votes correct.")
    min_positive_rate: float = Field(0.02, ge=0, lt=1, description="Verifiers voting correct less often are "
                                     "dropped.")
    max_positive_rate: float = Field(0.98, gt=0, le=1, description="Verifiers voting correct more often are "
                                     "dropped.")
    duplicate_agreement: float = Field(0.99, gt=0.5, le=1, description="A verifier agreeing with an earlier one "
                                       "on more than this share of the window is dropped as a duplicate.")

    @pydantic.model_validator(mode="after")
    def _rates(self) -> WeakSupervisionSpec:
        if self.max_positive_rate <= self.min_positive_rate:
            raise ValueError(MSG_POSITIVE_RATES)
        return self

    @pydantic.model_validator(mode="after")
    def _min_items(self) -> WeakSupervisionSpec:
        if self.min_items > self.window:
            raise ValueError(MSG_MIN_ITEMS_WINDOW)
        return self


class RewardSpec(Model):
    """How the verifiers' scores become one reward per completion."""

    aggregation: Aggregation = Field(Aggregation.WEIGHTED_SUM, description="WeightedSum | MajorityVote | "
                                     "WeakSupervision.")
    weak_supervision: WeakSupervisionSpec = Field(default_factory=WeakSupervisionSpec,
                                                  description="Settings of WeakSupervision.")
    cache_size: int = Field(65536, ge=0, le=100_000_000, description="Scores cached per verifier replica, keyed "
                            "by (verifier, prompt, reference, completion); 0 disables the cache.")
