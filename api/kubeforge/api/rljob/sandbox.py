"""A warm pool of sandbox pods for tool code that runs model-written programs (``spec.sandbox``; docs/sandboxes.md).

The pods are the job's but not its roles': no gang place, no world size, no attempt. Each serves ``slots`` leases;
an episode (a ``CodeFeedback`` episode, a ``CodeExecution`` completion) claims one, runs its programs there and
releases it. Pod settings are a role's minus what could carry a secret into a pod that runs hostile code (``envFrom``,
an ``env`` entry's ``valueFrom``, Secret / projected / ConfigMap / downward-API / CSI volumes: refused by
``validate_sandbox``; plain env values and hostPath, emptyDir or claimed volumes, e.g. for an interpreter with the
tools' libraries, are fine).

Neighbours: ``spec`` composes it; ``validate_sandbox`` holds the rules across sections (who uses the pool, limits).
"""
from __future__ import annotations

from pydantic import Field

from kubeforge.api.rljob.container import ResourceRequirements
from kubeforge.api.rljob.roles import PodSettings

DEFAULT_LIMITS = {"cpu": "1", "memory": "1Gi"}


def _default_resources() -> ResourceRequirements:
    return ResourceRequirements(limits=dict(DEFAULT_LIMITS), requests={})


class SandboxSpec(PodSettings):
    """The sandbox pods: ``replicas`` pods of ``slots`` leases each. Every run is a fresh confined process (the
    CodeExecution sandbox's rlimits, namespaces and Landlock where the kernel allows); a release kills what the
    lease started and wipes its files before the slot is claimed again."""

    resources: ResourceRequirements = Field(
        default_factory=_default_resources, description="Resource requests and limits of a sandbox pod (default "
        "limits cpu 1, memory 1Gi: a pod running model-written code must not starve its node).")
    slots: int = Field(8, ge=1, le=256, description="Leases (episodes' sandboxes) one pod serves at once.")
    max_run_seconds: float = Field(30.0, gt=0, le=600, description="The longest one run may take; a longer "
                                   "limit asked by a verifier or environment is cut to it.")
    idle_seconds: float = Field(60.0, ge=1, le=3600, description="A lease with no call for this long is "
                                "reclaimed (reset and freed): its episode's process died.")
