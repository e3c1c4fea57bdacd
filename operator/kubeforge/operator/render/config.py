"""The runtime ConfigMap: the RLJob manifest as YAML, mounted into every role at ``names.CONFIG_PATH``.

Role: hands the spec to the data plane in the same form the local launcher reads (``kubeforge.api.load``).
Invariant: the status is left out, so a status write never changes the ConfigMap (no restart loops).
"""
from __future__ import annotations

import yaml

from kubeforge.api import load, rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta


def manifest_yaml(job: rljob.RLJob) -> str:
    """The manifest the roles read: apiVersion, kind, name/namespace and spec (defaults filled in)."""
    doc = load.dump(job)
    doc.pop("status", None)
    md = {"name": job.metadata.name}
    if job.metadata.namespace:
        md["namespace"] = job.metadata.namespace
    doc["metadata"] = md
    return yaml.safe_dump(doc, sort_keys=True)


def config_map(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The ConfigMap holding ``names.CONFIG_FILE``."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": meta.metadata(job, ctx, name=names.config_map(job.metadata.name)),
        "data": {names.CONFIG_FILE: manifest_yaml(job)},
    }
