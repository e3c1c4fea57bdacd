"""The Kubernetes container pieces a role carries (secret references, environment variables, resources), typed
as the API server types them; ``kubeforge.api.rljob.roles`` composes them."""
from __future__ import annotations

from pydantic import Field

from kubeforge.api.rljob.base import NAME_PATTERN_DNS1123, Model, Quantity


class SecretReference(Model):
    """A Secret of the job's namespace, by name (a Kubernetes LocalObjectReference)."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN_DNS1123, description="The Secret's name.")


class EnvVar(Model):
    """An environment variable for a role's container."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str = Field("", description="Value.")


class ResourceRequirements(Model):
    """A Kubernetes ResourceRequirements: quantities per resource name (cpu, memory, nvidia.com/gpu, ...)."""

    limits: dict[str, int | Quantity] = Field(default_factory=dict, description="Limits per resource name.")
    requests: dict[str, int | Quantity] = Field(default_factory=dict, description="Requests per resource name.")


GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


def gpu_count(resources: ResourceRequirements) -> int:
    """GPUs a pod with ``resources`` holds (limits over requests; 0 without any)."""
    merged = {**resources.requests, **resources.limits}
    return max((int(str(merged[k])) for k in GPU_RESOURCES if str(merged.get(k, "")).isdigit()), default=0)
