"""The training algorithm (``spec.algorithm``: GRPO and its variants), how weights reach the generators
(``spec.weightSync``) and how the phases share the hardware (``spec.schedule``)."""
from __future__ import annotations

import enum

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import IMMUTABLE, Model, cel, schema_extra


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
        json_schema_extra=schema_extra(
            cel("!has(self.clipEpsilonHigh) || self.clipEpsilonHigh >= self.clipEpsilon", MSG_CLIP_HIGH),
            cel("!has(self.overlongBuffer) || self.overlongBuffer.length < self.maxNewTokens", MSG_OVERLONG_LENGTH),
            cel("self == oldSelf", f"spec.algorithm {IMMUTABLE}"),
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
    delta: bool = Field(False, description="Send only the elements whose bits changed since the generators' version "
                        "(lossless; full when that is not smaller, or when a generator lacks that version). The "
                        "trainer keeps its delta beside its snapshot of the last-sent weights (docs/runtime.md).")


class ScheduleMode(str, enum.Enum):
    OVERLAPPED = "Overlapped"
    COLOCATED = "Colocated"
    DISAGGREGATED = "Disaggregated"


MSG_GENERATOR_CPUS_MODE = "generatorCpus applies only to mode Disaggregated"


class ScheduleSpec(Model):
    """How generation and training share the hardware (docs/runtime.md, "Schedule modes")."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(cel("!has(self.generatorCpus) || self.mode == 'Disaggregated'",
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
