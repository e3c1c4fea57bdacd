"""Topology placement: pack the whole job into one domain of a node label, keep domains exclusive, and apply
per-role node selectors and tolerations.

Role: returns the scheduling fragment of a role's pod spec (``affinity``, ``nodeSelector``, ``tolerations``).
How: packing is pod affinity to the job's own pods (``contract.LABEL_JOB``) over ``placement.topologyKey`` —
the scheduler lets the first pod of a job go anywhere, then every later pod (gang members waiting at Permit count
too) must join its domain; ``exclusive`` is required anti-affinity to pods of every other RLJob (label present,
value not this job) over the same key, which the scheduler also enforces in reverse for the other job's pods.
A role's ``affinity`` adds, for that role's pods only, pod affinity to the pods of each role in ``colocateWith``
and anti-affinity to those of each role in ``apartFrom`` (same job: labels ``LABEL_JOB`` and ``LABEL_ROLE``) over
its ``topologyKey``; required anti-affinity is symmetric in the scheduler, so the other role's pods keep out too.
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


def _same_role(job: rljob.RLJob, role: str, key: str) -> meta.Obj:
    return {"labelSelector": {"matchLabels": {contract.LABEL_JOB: job.metadata.name, contract.LABEL_ROLE: role}},
            "topologyKey": key}


def _add_terms(out: meta.Obj, kind: str, terms: list[meta.Obj], mode: str) -> None:
    if not terms:
        return
    section = out.setdefault(kind, {})
    if mode == rljob.PlacementMode.REQUIRED.value:
        section.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).extend(terms)
    else:
        section.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).extend(
            {"weight": PREFERRED_WEIGHT, "podAffinityTerm": t} for t in terms)


def role_affinity(job: rljob.RLJob, role: str) -> meta.Obj | None:
    """The job's affinity plus ``role``'s own (``roles.<role>.affinity``), or None when neither is set."""
    out: meta.Obj = affinity(job) or {}
    ra = getattr(job.spec.roles, role).affinity
    if ra is not None:
        mode = str(getattr(ra.mode, "value", ra.mode))
        _add_terms(out, "podAffinity", [_same_role(job, str(getattr(r, "value", r)), ra.topology_key)
                                        for r in ra.colocate_with], mode)
        _add_terms(out, "podAntiAffinity", [_same_role(job, str(getattr(r, "value", r)), ra.topology_key)
                                            for r in ra.apart_from], mode)
    return out or None


def keep_off(nodes: tuple[str, ...]) -> meta.Obj:
    """Required node affinity that keeps a pod off ``nodes`` (by hostname: a node's name label)."""
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": HOSTNAME_KEY, "operator": "NotIn", "values": sorted(nodes)}]}]}}


def pod_placement(job: rljob.RLJob, role: str, *, avoid: tuple[str, ...] = ()) -> meta.Obj:
    """The placement fields of ``role``'s pod spec (only the ones that are set); ``avoid``: nodes to keep off
    (``RenderContext.avoid_nodes``)."""
    spec = getattr(job.spec.roles, role)
    out: meta.Obj = {}
    aff = role_affinity(job, role)
    if avoid:
        aff = {**(aff or {}), "nodeAffinity": keep_off(avoid)}
    if aff:
        out["affinity"] = aff
    if spec.node_selector:
        out["nodeSelector"] = dict(sorted(spec.node_selector.items()))
    if spec.tolerations:
        out["tolerations"] = [dict(t) for t in spec.tolerations]
    return out
