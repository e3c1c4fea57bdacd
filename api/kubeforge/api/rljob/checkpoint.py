"""Trainer checkpoints (``spec.checkpoint``): where they are written and the volume that keeps them."""
from __future__ import annotations

import enum

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import IMMUTABLE, NAME_PATTERN_DNS1123, Model, Quantity, cel, schema_extra


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
        json_schema_extra=schema_extra(
            {**cel("self.path.startsWith('/')", MSG_CHECKPOINT_ABSOLUTE), "fieldPath": ".path"},
            cel("!has(self.claimName) || !has(self.volumeClaimTemplate)", MSG_CHECKPOINT_ONE_VOLUME),
            cel("has(self.volumeClaimTemplate) == has(oldSelf.volumeClaimTemplate) && (!has(self.volumeClaimTemplate)"
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
