"""The Kubernetes container pieces a role carries (secret references, environment variables and their sources,
resources), typed as the API server types them; ``kubeforge.api.rljob.roles`` composes them.

Neighbours: the operator renders them into the role's container as they are (``render.env``,
``render.statefulset``); the local launcher has no cluster, so it resolves ``valueFrom``/``envFrom`` by its own
rule (docs/launcher.md, "Secrets and ConfigMaps"). Invariant: each "exactly one of" below is a CEL rule of the CRD
and a validator here with the same message.
"""
from __future__ import annotations

from typing import Annotated, Any

import pydantic
from pydantic import Field
from pydantic_core import PydanticCustomError

from kubeforge.api.rljob.base import NAME_PATTERN_DNS1123, QUANTITY_PATTERN, Model, Quantity, cel, schema_extra

#: A key of a Secret or ConfigMap (the API server's own rule).
DATA_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
#: What ``envFrom[].prefix`` may be: the start of an environment variable name.
ENV_PREFIX_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

MSG_ENV_ONE_VALUE = "value and valueFrom are mutually exclusive (neither: the empty string)"
MSG_ENV_ONE_SOURCE = "exactly one of secretKeyRef or configMapKeyRef must be set"
MSG_ENV_FROM_ONE_SOURCE = "exactly one of secretRef or configMapRef must be set"


class SecretReference(Model):
    """A Secret of the job's namespace, by name (a Kubernetes LocalObjectReference)."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN_DNS1123, description="The Secret's name.")


class KeySelector(Model):
    """One key of a Secret or ConfigMap of the job's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN_DNS1123, description="The object's name.")
    key: str = Field(min_length=1, max_length=253, pattern=DATA_KEY_PATTERN, description="The key in its data.")
    optional: bool = Field(False, description="Start the pod even when the object or the key is missing (the "
                           "variable is then unset); false: the pod waits for them (CreateContainerConfigError).")


class EnvVarSource(Model):
    """Where a variable's value comes from. Exactly one source."""

    model_config = pydantic.ConfigDict(json_schema_extra=schema_extra(
        cel("[has(self.secretKeyRef), has(self.configMapKeyRef)].filter(x, x).size() == 1", MSG_ENV_ONE_SOURCE)))

    secret_key_ref: KeySelector | None = Field(None, description="A key of a Secret (e.g. an HF token or an API "
                                               "key); the kubelet reads it when the pod starts.")
    config_map_key_ref: KeySelector | None = Field(None, description="A key of a ConfigMap.")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> EnvVarSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError(MSG_ENV_ONE_SOURCE)
        return self


class EnvVar(Model):
    """An environment variable for a role's container: a literal value or one read from a Secret or ConfigMap."""

    model_config = pydantic.ConfigDict(json_schema_extra=schema_extra(
        cel("!has(self.value) || !has(self.valueFrom)", MSG_ENV_ONE_VALUE)))

    name: str = Field(min_length=1, description="Variable name.")
    # Not "exactly one": as on every Kubernetes container, a name alone is the empty string.
    value: str | None = Field(None, description="Value (unset, with no valueFrom: the empty string).")
    value_from: EnvVarSource | None = Field(None, description="Read the value from a Secret or ConfigMap key "
                                            "instead (on a cluster; see docs/launcher.md for `kubeforge run`).")

    @pydantic.model_validator(mode="after")
    def _one_value(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(MSG_ENV_ONE_VALUE)
        return self


class ObjectReference(Model):
    """A whole Secret or ConfigMap of the job's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=NAME_PATTERN_DNS1123, description="The object's name.")
    optional: bool = Field(False, description="Start the pod even when the object is missing.")


class EnvFromSource(Model):
    """Every key of a Secret or ConfigMap as a variable (named ``prefix`` + key). Exactly one source. The role's
    ``env`` and kubeforge's own variables win over a key of the same name."""

    model_config = pydantic.ConfigDict(json_schema_extra=schema_extra(
        cel("[has(self.secretRef), has(self.configMapRef)].filter(x, x).size() == 1", MSG_ENV_FROM_ONE_SOURCE)))

    prefix: str | None = Field(None, min_length=1, max_length=253, pattern=ENV_PREFIX_PATTERN,
                               description="Prepended to every key.")
    secret_ref: ObjectReference | None = Field(None, description="A Secret.")
    config_map_ref: ObjectReference | None = Field(None, description="A ConfigMap.")

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> EnvFromSource:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError(MSG_ENV_FROM_ONE_SOURCE)
        return self


def _int_or_quantity(value: Any, handler: pydantic.ValidatorFunctionWrapHandler) -> Any:
    """One error for the union, not one per member: the API server says "a quantity" once, and so do we."""
    try:
        return handler(value)
    except pydantic.ValidationError:
        raise PydanticCustomError(     # the API server's words for a quantity string ("should match")
            "int_or_quantity", "{value}: should match '{pattern}' (an integer, or a quantity such as '500m' or "
            "'4Gi')", {"value": repr(value), "pattern": QUANTITY_PATTERN}) from None


#: A resource amount: an integer or a quantity string (``x-kubernetes-int-or-string`` in the CRD).
IntOrQuantity = Annotated[int | Quantity, pydantic.WrapValidator(_int_or_quantity)]


class ResourceRequirements(Model):
    """A Kubernetes ResourceRequirements: quantities per resource name (cpu, memory, nvidia.com/gpu, ...)."""

    limits: dict[str, IntOrQuantity] = Field(default_factory=dict, description="Limits per resource name.")
    requests: dict[str, IntOrQuantity] = Field(default_factory=dict, description="Requests per resource name.")


GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


def gpu_count(resources: ResourceRequirements) -> int:
    """GPUs a pod with ``resources`` holds (limits over requests; 0 without any)."""
    merged = {**resources.requests, **resources.limits}
    return max((int(str(merged[k])) for k in GPU_RESOURCES if str(merged.get(k, "")).isdigit()), default=0)
