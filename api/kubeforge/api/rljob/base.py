"""The base of every RLJob type and the helpers the parts of the model share (``kubeforge.api.rljob``).

Invariants (of the whole model):
- Field names are lowerCamelCase (the wire names); Python attributes are snake_case.
- Every field carries a description: it becomes ``kubectl explain`` text.
- Every rule the API server enforces with CEL (``x-kubernetes-validations``) is enforced here too by a validator
  with the same message, so the local launcher refuses exactly what the cluster refuses (transition rules such as
  immutability are the exception: a local run has no "old" object).
"""
from __future__ import annotations

import re
from typing import Annotated, Any

import pydantic
from pydantic.alias_generators import to_camel


NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
#: A DNS-1123 subdomain (names of PersistentVolumeClaims and most other objects).
NAME_PATTERN_DNS1123 = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class Model(pydantic.BaseModel):
    """Base of every API type: camelCase wire names, unknown fields refused."""

    # validate_by_name: Python code builds models by attribute name (the keyword arguments mypy checks). A manifest
    # is validated by wire name only: ``kubeforge.api.load.parse`` passes ``by_name=False``, so ``prompts_per_step``
    # is an unknown field there, as it is to the API server.
    model_config = pydantic.ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid",
        use_enum_values=True, validate_default=True,
    )


def cel(rule: str, message: str) -> dict[str, Any]:
    """A CEL rule for the CRD; the same message is raised by the matching pydantic validator."""
    return {"rule": rule, "message": message}


def schema_extra(*rules: dict[str, Any], **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(extra)
    if rules:
        out["x-kubernetes-validations"] = list(rules)
    return out


IMMUTABLE = "is immutable while the job exists"


# A Kubernetes resource quantity written as a string ("500m", "4Gi", "1e3"), as the API server's own pattern.
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
Quantity = Annotated[str, pydantic.StringConstraints(pattern=QUANTITY_PATTERN)]


FREE_FORM: dict[str, pydantic.JsonValue] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def duplicates(names: list[str]) -> list[str]:
    """Names listed more than once (a list-map's key must be unique), sorted."""
    return sorted({n for n in names if names.count(n) > 1})


ENTRY_POINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
MSG_ENTRY_POINT = "entryPoint must look like 'package.module:function'"


def _entry_point_shape(v: str) -> str:
    """The validator behind ``ENTRY_POINT_RULE`` (the API server's CEL rule, the same message)."""
    if not re.fullmatch(ENTRY_POINT_PATTERN, v):
        raise ValueError(MSG_ENTRY_POINT)
    return v


ENTRY_POINT_RULE = cel(f"self.entryPoint.matches('{ENTRY_POINT_PATTERN}')", MSG_ENTRY_POINT)
#: A 'package.module:function' string (its class carries ``ENTRY_POINT_RULE`` for the CRD).
EntryPoint = Annotated[str, pydantic.AfterValidator(_entry_point_shape)]
