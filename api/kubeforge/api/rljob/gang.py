"""Cluster-only scheduling of the whole job: gang scheduling (``spec.gang``) and topology placement
(``spec.placement``). The local launcher ignores both."""
from __future__ import annotations

import enum

import pydantic
from pydantic import Field

from kubeforge.api.rljob.base import NAME_PATTERN_DNS1123, Model, cel, schema_extra
from kubeforge.api.rljob.roles import PlacementMode


class GangBackend(str, enum.Enum):
    AUTO = "Auto"                    # the operator decides per job from what the cluster serves (docs/operator.md)
    COSCHEDULING = "Coscheduling"
    VOLCANO = "Volcano"
    KAI = "KAI"
    KUEUE = "Kueue"
    NONE = "None"


class GangSpec(Model):
    """Gang scheduling: every pod of every role starts together or none does."""

    backend: GangBackend = Field(
        GangBackend.AUTO, description="Auto | Coscheduling | Volcano | KAI | Kueue | None. Auto (the default): "
        "Kueue's admission of the whole job when the RLJob carries the kueue.x-k8s.io/queue-name label; else "
        "Coscheduling when the cluster serves PodGroups (scheduling.x-k8s.io) and the operator names a scheduler "
        "that serves them; else None. The condition GangScheduling says which was chosen and why.")
    schedule_timeout_seconds: int = Field(600, ge=1, le=86400, description="How long a gang may wait for room "
                                          "before the scheduler gives up on this attempt (backends that support it).")
    queue: str | None = Field(None, min_length=1, description="Queue name (Volcano, KAI, Kueue).")
    scheduler_name: str | None = Field(
        None, min_length=1, max_length=253, pattern=NAME_PATTERN_DNS1123, description="schedulerName of every role "
        "pod (a scheduler profile serving the backend). Unset: the backend's own (volcano, kai-scheduler; for "
        "Coscheduling the operator's setting gang.coschedulingSchedulerName), else the cluster's default.")


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
