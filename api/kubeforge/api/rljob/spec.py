"""The RLJob object: its spec (composed of the parts in this package), its metadata rules and the object itself.

The parts are imported by name, not by module: pydantic resolves a field's annotation in the class namespace first,
where a field called ``model`` or ``task`` would hide a module of that name."""
from __future__ import annotations

import re
from typing import ClassVar, Literal

import pydantic
from pydantic import Field

from kubeforge.api import contract
from kubeforge.api.rljob.agent import AgentSpec
from kubeforge.api.rljob.algorithm import AlgorithmSpec, ScheduleSpec, WeightSyncSpec
from kubeforge.api.rljob.base import NAME_PATTERN, Model, cel, schema_extra
from kubeforge.api.rljob.checkpoint import CheckpointSpec
from kubeforge.api.rljob.environment import EnvironmentSpec
from kubeforge.api.rljob.failure import FailurePolicySpec
from kubeforge.api.rljob.gang import GangSpec, PlacementSpec
from kubeforge.api.rljob.model import ModelSpec
from kubeforge.api.rljob.pool import MSG_POOL_NEEDS_LORA, SPEC_RULES as POOL_RULES, GeneratorPoolRef
from kubeforge.api.rljob.roles import RolesSpec
from kubeforge.api.rljob.sandbox import SandboxSpec
from kubeforge.api.rljob.status import RLJobStatus
from kubeforge.api.rljob.task import EvaluationSpec, TaskSpec
from kubeforge.api.rljob.verifiers import RewardSpec, VerifierSpec


MSG_EVAL_VERIFIER = "must name one of spec.verifiers"
MSG_AGENT_TYPE = "agent must be set when environment.type is Agent, and only then"
MSG_AGENT_POOL = "agent cannot be used with generatorPool: the pool's engines serve no agents endpoint"


class RLJobSpec(Model):
    """Desired state of an RLJob."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(
            cel("!has(self.evaluation) || !has(self.evaluation.verifier) || "
                 "self.verifiers.exists(v, v.name == self.evaluation.verifier)",
                 f"evaluation.verifier: {MSG_EVAL_VERIFIER}"),
            *POOL_RULES,
            cel("has(self.agent) == (has(self.environment) && self.environment.type == 'Agent')",
                MSG_AGENT_TYPE),
            cel("!has(self.agent) || !has(self.generatorPool)", MSG_AGENT_POOL),
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
    agent: AgentSpec | None = Field(None, description="The user's agent program in pods of its own, one process "
                                    "per episode, calling the policy through the generators' endpoint with "
                                    "per-episode credentials (environment.type Agent; docs/agents.md).")
    sandbox: SandboxSpec | None = Field(None, description="A warm pool of sandbox pods where the CodeFeedback "
                                        "environment's and the CodeExecution verifier's programs run, one lease "
                                        "per episode (docs/sandboxes.md); unset: they run beside the environment.")
    weight_sync: WeightSyncSpec = Field(default_factory=WeightSyncSpec, description="Trainer to generator sync.")
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec, description="How generation and training share "
                                   "the cores or GPUs: Overlapped | Colocated | Disaggregated.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Trainer checkpoints.")
    roles: RolesSpec = Field(default_factory=RolesSpec, description="Generator, verifier and trainer roles.")
    generator_pool: GeneratorPoolRef | None = Field(
        None, description="Sample on a GeneratorPool's engines instead of generators of the job's own "
        "(spec.roles.generator is then unused): needs spec.model.lora and the pool's base model "
        "(docs/generator-pool.md).")
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

    @pydantic.model_validator(mode="after")
    def _agent(self) -> RLJobSpec:
        typed = self.environment is not None and self.environment.type == "Agent"
        if (self.agent is not None) != typed:
            raise ValueError(MSG_AGENT_TYPE)
        if self.agent is not None and self.generator_pool is not None:
            raise ValueError(MSG_AGENT_POOL)
        return self

    @pydantic.model_validator(mode="after")
    def _pool_needs_lora(self) -> RLJobSpec:
        if self.generator_pool is not None and self.model.lora is None:
            raise ValueError(MSG_POOL_NEEDS_LORA)
        return self

    def own_roles(self) -> tuple[str, ...]:
        """The roles whose pods (processes) the job runs itself: all three, or without the generators when they are
        a pool's (``spec.generatorPool``)."""
        if self.generator_pool is not None:
            return tuple(r for r in contract.ROLES if r != "generator")
        return contract.ROLES


MSG_NAME_TOO_LONG = (f"must be no more than {contract.MAX_JOB_NAME_LENGTH} characters, so that the names of the "
                     "job's children fit DNS limits")
MSG_NAME_NOT_DNS1035 = ("must be a DNS-1035 label: lowercase letters, digits and '-', starting with a letter and "
                        "ending with a letter or digit")
def name_rules(*, max_length: int, too_long: str) -> tuple[dict[str, str], ...]:
    """The CEL rules on ``metadata.name`` at a CRD's root (a CRD cannot constrain ``metadata`` in its schema)."""
    return (
        {"rule": f"self.metadata.name.size() <= {max_length}", "message": too_long, "fieldPath": ".metadata.name"},
        {"rule": f"self.metadata.name.matches('{NAME_PATTERN}')", "message": MSG_NAME_NOT_DNS1035,
         "fieldPath": ".metadata.name"},
    )


NAME_RULES = name_rules(max_length=contract.MAX_JOB_NAME_LENGTH, too_long=MSG_NAME_TOO_LONG)


class ObjectMeta(Model):
    """The parts of Kubernetes ObjectMeta a manifest may carry (the API server owns the rest).

    The name rules are CEL rules at the CRD's root (``NAME_RULES``: a CRD cannot constrain ``metadata`` in its
    OpenAPI schema); the validator below raises their messages. A kind whose children derive other names from its
    name sets its own limit (``name_limit``, ``name_too_long``)."""

    model_config = pydantic.ConfigDict(extra="ignore")
    name_limit: ClassVar[int] = contract.MAX_JOB_NAME_LENGTH
    name_too_long: ClassVar[str] = MSG_NAME_TOO_LONG

    name: str = Field(min_length=1, description="Job name; children's names derive from it.")
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @pydantic.field_validator("name")
    @classmethod
    def _name_rules(cls, v: str) -> str:
        if len(v) > cls.name_limit:
            raise ValueError(cls.name_too_long)
        if not re.fullmatch(NAME_PATTERN, v):
            raise ValueError(MSG_NAME_NOT_DNS1035)
        return v


class RLJob(Model):
    """An RL post-training job: generator, verifier and trainer roles running GRPO as one gang."""

    model_config = pydantic.ConfigDict(json_schema_extra=schema_extra(*NAME_RULES))

    api_version: Literal["kubeforge.dev/v1alpha1"] = Field("kubeforge.dev/v1alpha1", alias="apiVersion")
    kind: Literal["RLJob"] = "RLJob"
    metadata: ObjectMeta
    spec: RLJobSpec
    status: RLJobStatus | None = None
