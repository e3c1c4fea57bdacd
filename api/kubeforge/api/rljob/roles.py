"""The three roles (``spec.roles``: generator, verifier, trainer): replicas, pod settings and placement relative
to each other. The operator renders one StatefulSet per role from them; the local launcher one process group."""
from __future__ import annotations

import enum
from typing import Any

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import FREE_FORM, IMMUTABLE, Model, cel, duplicates, schema_extra
from kubeforge.api.rljob.container import EnvFromSource, EnvVar, ResourceRequirements, SecretReference, gpu_count


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

    model_config = pydantic.ConfigDict(json_schema_extra=schema_extra(
        cel("!has(self.colocateWith) || !has(self.apartFrom) || "
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


class PodSettings(Model):
    """A set of identical pods (a role's, or a generator pool's engines): how many, image, env, resources, node
    placement, volumes."""

    replicas: int = Field(1, ge=1, le=4096, description="Pods (processes) of this role.")
    image: str | None = Field(None, min_length=1, description="Container image; defaults to the operator's "
                              "runtime image.")
    image_pull_secrets: list[SecretReference] = Field(
        default_factory=list, max_length=16, description="Secrets (kubernetes.io/dockerconfigjson, in the job's "
        "namespace) the kubelet uses to pull the role's image from a private registry; unset: the operator's "
        "default (the chart's rolePods.imagePullSecrets).")
    command: list[str] | None = Field(None, description="Container command override (e.g. a host Python for "
                                      "tests); the role entrypoint `kubeforge role <role>` is appended as args.")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=256, description="Extra environment variables (names unique).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    env_from: list[EnvFromSource] = Field(
        default_factory=list, max_length=32, description="Every key of a Secret or ConfigMap as a variable; `env` "
        "and kubeforge's own variables win over a key of the same name.")
    resources: ResourceRequirements = Field(default_factory=ResourceRequirements,
                                            description="Resource requests and limits of the role's container.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the role's pods need.")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes tolerations of the role's pods.",
        json_schema_extra={"items": FREE_FORM})
    volumes: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes volumes added to the role's pods.",
        json_schema_extra={"items": FREE_FORM})
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes volumeMounts added to the role's container.",
        json_schema_extra={"items": FREE_FORM})
    priority_class_name: str | None = Field(None, description="PriorityClass of the role's pods.")

    @pydantic.field_validator("env")
    @classmethod
    def _unique_env(cls, v: list[EnvVar]) -> list[EnvVar]:
        dup = duplicates([x.name for x in v])
        if dup:
            raise ValueError(f"Duplicate value: env names must be unique: {', '.join(dup)}")
        return v


class RoleSpec(PodSettings):
    """Settings shared by every role."""

    affinity: RoleAffinity | None = Field(None, description="Placement relative to the job's roles: co-locate "
                                          "with some, keep apart from others (pod affinity over topologyKey).")


class EngineSettings(Model):
    """vLLM engine settings, of a job's generators or of a generator pool's engines."""

    tensor_parallel_size: int = Field(1, ge=1, le=64, description="vLLM tensor parallelism inside one replica.")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vLLM GPU memory share (GPU only).")
    kv_cache_gib: int = Field(1, ge=1, le=1024, description="vLLM KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE).")
    max_model_len: int | None = Field(None, ge=16, description="vLLM max model length; defaults to the model's.")
    enforce_eager: bool = Field(False, description="Skip vLLM graph compilation (faster start, slower decode).")


MSG_MIN_REPLICAS = "minReplicas must be less than or equal to replicas"


class GeneratorRole(EngineSettings, RoleSpec):
    """The generator role: a vLLM engine per replica."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=schema_extra(cel("!has(self.minReplicas) || self.minReplicas <= self.replicas",
                                             MSG_MIN_REPLICAS)))

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
        json_schema_extra=schema_extra(cel("self.replicas == oldSelf.replicas", MSG_TRAINER_IMMUTABLE))
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

    model_config = pydantic.ConfigDict(json_schema_extra=schema_extra(cel(
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
