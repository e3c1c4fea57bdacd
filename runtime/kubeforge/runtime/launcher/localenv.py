"""A role's own ``env`` for a local process: literal values as on a pod; ``valueFrom`` and ``envFrom`` from the
launcher's environment, since ``kubeforge run`` has no cluster to read a Secret or ConfigMap from.

Role: the launcher's stand-in for the kubelet's env resolution (docs/launcher.md, "Secrets and ConfigMaps").
Rule: an ``env[]`` entry with ``valueFrom`` takes the launcher's variable of the same name (``HF_TOKEN=...
kubeforge run job.yaml``); when it is unset the run is refused before any process starts, naming the field,
unless the key is ``optional`` (then the variable stays unset, as on a pod). ``envFrom`` adds nothing: every role
process already inherits the launcher's environment, and a local run cannot list a Secret's keys.
Neighbours: ``launcher.main`` calls ``problems`` in ``prepare`` and ``values`` per process.
"""
from __future__ import annotations

from collections.abc import Mapping

from kubeforge.api import contract, rljob


def _source(e: rljob.EnvVar) -> tuple[str, rljob.KeySelector] | None:
    """(what the cluster would read, its selector) of a ``valueFrom`` entry; None for a literal value."""
    src = e.value_from
    if src is None:
        return None
    if src.secret_key_ref is not None:
        return "Secret", src.secret_key_ref
    assert src.config_map_key_ref is not None      # the model holds exactly one
    return "ConfigMap", src.config_map_key_ref


def problems(job: rljob.RLJob, environ: Mapping[str, str]) -> list[str]:
    """One ``path: message`` per required ``valueFrom`` variable the launcher's environment lacks."""
    out = []
    for role in contract.ROLES:
        for i, e in enumerate(getattr(job.spec.roles, role).env):
            source = _source(e)
            if source is None or e.name in environ or source[1].optional:
                continue
            kind, ref = source
            out.append(f"spec.roles.{role}.env[{i}].valueFrom: Required value: kubeforge run reads no {kind} "
                       f"(it has no cluster): set {e.name} in the launcher's environment (the value of {kind} "
                       f"{ref.name!r}, key {ref.key!r}), or mark the key optional")
    return out


def values(spec: rljob.PodSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The role's (or the agent's) own variables for its process: literals, and ``valueFrom`` ones the launcher's
    environment has."""
    out = {}
    for e in spec.env:
        if e.value_from is None:
            out[e.name] = e.value or ""
        elif e.name in environ:
            out[e.name] = environ[e.name]
    return out
