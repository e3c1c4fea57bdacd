"""The observed state of a GeneratorPool (``status``), written by the operator only.

``readyEngines`` and ``attachedJobs`` come from the cluster (the pool's StatefulSet, the RLJobs naming the pool);
``jobPorts`` is the operator's own record of the port block it gave each attached job (``poolports``: kept across
passes, freed when the job goes);
``residentAdapters`` and ``utilisation`` are the engines' to report (the runtime's sharing, docs/generator-pool.md):
unset until an engine reports them.
"""
from __future__ import annotations

import pydantic
from pydantic import Field

from kubeforge.api import rljob


class PoolJobPort(rljob.Model):
    """The port block an attached job is served at on every engine of the pool."""

    model_config = pydantic.ConfigDict(extra="ignore")

    name: str = Field(description="The attached RLJob's name.")
    port_base: int = Field(description="First port of the job's block on every engine (its data port is this plus "
                                       "1); the job's roles list the engines at this port base.")


class GeneratorPoolStatus(rljob.Model):
    """Observed state of a GeneratorPool, written by the operator only."""

    model_config = pydantic.ConfigDict(extra="ignore")

    observed_generation: int | None = Field(None, description="Generation of the spec last reconciled.")
    conditions: list[rljob.Condition] = Field(
        default_factory=list, description="Conditions (Ready, Terminating), one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]})
    replicas: int = Field(0, description="Engines wanted.")
    ready_engines: int = Field(0, description="Engines ready (their pods pass the readiness probe).")
    ready: str | None = Field(None, description="Ready engines as 'ready/replicas' (printer column).")
    attached_jobs: list[str] = Field(default_factory=list, description="Names of the RLJobs (in the pool's "
                                     "namespace) whose spec.generatorPool names this pool, sorted.")
    attached: int = Field(0, description="How many RLJobs are attached (printer column).")
    job_ports: list[PoolJobPort] = Field(
        default_factory=list, description="The port block of each attached job, by name (assigned by the operator, "
                                          "stable while the job is attached).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    resident_adapters: int | None = Field(None, description="Adapters resident in the engines now (reported by "
                                          "the engines).")
    utilisation: float | None = Field(None, description="Share of the last minute the engines spent generating, "
                                      "0 to 1 (reported by the engines).")
