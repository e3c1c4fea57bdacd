"""Cluster-only scheduling of the whole job: gang scheduling (``spec.gang``) and topology placement
(``spec.placement``). The local launcher ignores both."""
from __future__ import annotations

import enum

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import Model, cel, schema_extra
from kubeforge.api.rljob.roles import PlacementMode


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
        json_schema_extra=schema_extra(cel("!self.exclusive || has(self.topologyKey)", MSG_EXCLUSIVE_NEEDS_KEY))
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
