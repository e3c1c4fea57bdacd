"""Topology placement: pack the whole job into one domain of a node label, keep domains exclusive, and apply
per-role node selectors and tolerations.

Role: returns the scheduling fragment of a role's pod spec (``affinity``, ``nodeSelector``, ``tolerations``).
How: packing is pod affinity to the job's own pods (``contract.LABEL_JOB``) over ``placement.topologyKey`` —
the scheduler lets the first pod of a job go anywhere, then every later pod (gang members waiting at Permit count
too) must join its domain; ``exclusive`` is required anti-affinity to pods of every other RLJob (label present,
value not this job) over the same key, which the scheduler also enforces in reverse for the other job's pods.
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator.render import meta

#: Topology key used for ``exclusive`` when the spec names none: one job per node.
HOSTNAME_KEY = "kubernetes.io/hostname"
PREFERRED_WEIGHT = 100


def _same_job(job: rljob.RLJob, key: str) -> meta.Obj:
    return {"labelSelector": {"matchLabels": {contract.LABEL_JOB: job.metadata.name}}, "topologyKey": key}


def _other_jobs(job: rljob.RLJob, key: str) -> meta.Obj:
    return {
        "labelSelector": {"matchExpressions": [
            {"key": contract.LABEL_JOB, "operator": "Exists"},
            {"key": contract.LABEL_JOB, "operator": "NotIn", "values": [job.metadata.name]},
        ]},
        "topologyKey": key,
    }


def affinity(job: rljob.RLJob) -> meta.Obj | None:
    """Pod affinity/anti-affinity for every pod of the job, or None without placement settings."""
    p = job.spec.placement
    out: meta.Obj = {}
    if p.topology_key:
        term = _same_job(job, p.topology_key)
        if p.mode == rljob.PlacementMode.REQUIRED.value:
            out["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
        else:
            out["podAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": PREFERRED_WEIGHT, "podAffinityTerm": term}]}
    if p.exclusive:
        out["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
            _other_jobs(job, p.topology_key or HOSTNAME_KEY)]}
    return out or None


def pod_placement(job: rljob.RLJob, role: str) -> meta.Obj:
    """The placement fields of ``role``'s pod spec (only the ones that are set)."""
    spec = getattr(job.spec.roles, role)
    out: meta.Obj = {}
    aff = affinity(job)
    if aff:
        out["affinity"] = aff
    if spec.node_selector:
        out["nodeSelector"] = dict(sorted(spec.node_selector.items()))
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    return out
