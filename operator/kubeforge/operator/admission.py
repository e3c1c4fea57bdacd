"""Admission review of RLJobs: the very checks of the local launcher (``kubeforge.api.load.parse``), as a pure
function of the object under review.

Neighbours: ``handlers`` registers it as kopf's validating webhook (``@kopf.on.validate``) and turns problems into a
denial; ``webhook`` serves it over HTTPS and registers it with the API server. The API server runs its CRD schema
and CEL rules first, so what reaches this review is schema-valid; the cross-field and semantic rules of
``kubeforge.api.validate`` (and any model validator CEL cannot express) decide here.

``respond`` wraps ``review`` in the AdmissionReview envelope (admission.k8s.io/v1) for the operator's own HTTPS
server (``webhook.AdmissionServer``, served by every replica, standbys included); kopf builds the envelope itself
when it serves the webhook.

Beyond the launcher's checks, one about the image (``RuntimeImage``): what the operator's runtime image cannot run
is refused here, where the launcher (local processes) has no image. ``spec.environment.type: Verifiers`` runs the
``verifiers`` library in the generator pods; when the generator names no image of its own and the operator's runtime
image does not carry the library (``--runtime-image-features`` without ``verifiers``), the pods could only fail at
start, so the job is refused naming the field. A role's own image is the user's to vouch for: admitted.

A job that names a GeneratorPool (``spec.generatorPool``) is also reviewed against the pool, read from the API server
by ``pools`` (``PoolLookup``): refused unless it has the pool's base model and an adapter rank within the pool's
``maxLoraRank`` (``kubeforge.api.validate_pool``, the words of ``kubeforge validate pool.yaml job.yaml``), or when
the pool is being deleted. A pool that does not exist (yet) is admitted: the job waits for it, as a pod waits for
its PVC. A pool that cannot be read is a refusal (the API server's retry, or the user's, settles it), never an
admission the job's pool would not have given.

Invariants: CREATE is always reviewed; an UPDATE only when the spec changed, so a job stored before the webhook
existed can still be annotated, have its status written, and be deleted. The denial message lists every problem
as ``path: message`` joined by ``; `` (one line, as the API server shows it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from kubeforge.api import load, rljob, validate_pool

#: What a runtime image may carry beyond kubeforge and its roles (the operator's ``--runtime-image-features``):
#: ``verifiers``, the library's own interpreter (``KUBEFORGE_ENVS_PYTHON``) for ``environment.type: Verifiers``.
FEATURE_VERIFIERS = "verifiers"
FEATURES = (FEATURE_VERIFIERS,)

KEYS = ("apiVersion", "kind", "metadata", "spec")
DENIED_CODE = 422


#: Reads a GeneratorPool by (namespace, name): its body, or None when there is none (raises when it cannot read).
PoolLookup = Callable[[str, str], Mapping[str, Any] | None]


class MalformedReview(ValueError):
    """The request is not an admission.k8s.io/v1 AdmissionReview with a request uid."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeImage:
    """The image of roles that name none (the operator's ``--runtime-image``) and what it carries (``FEATURES``)."""

    image: str
    features: frozenset[str]


def review(operation: str, body: Mapping[str, Any], old: Mapping[str, Any] | None = None, *,
           runtime: RuntimeImage | None = None, pools: PoolLookup | None = None, namespace: str = "") -> list[str]:
    """Problems that make ``body`` (the object as it would be stored) unacceptable; empty to admit it. With
    ``runtime``, also what that image cannot run (``image_problems``); with ``pools``, what the GeneratorPool the
    job names refuses (``pool_problems``; ``namespace``: the request's, when the body carries none)."""
    if operation not in ("CREATE", "UPDATE"):
        return []
    if operation == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
        return []
    doc = {k: body[k] for k in KEYS if k in body}
    try:
        job = load.parse(doc)
    except load.InvalidRLJob as exc:
        return list(exc.problems)
    out = image_problems(doc.get("spec") or {}, runtime) if runtime is not None else []
    if pools is not None:
        out += pool_problems(job, pools, namespace=job.metadata.namespace or namespace)
    return out


def pool_problems(job: rljob.RLJob, pools: PoolLookup, *, namespace: str) -> list[str]:
    """What the GeneratorPool ``job`` names says against it (the module docstring: absent pools are admitted)."""
    ref = job.spec.generator_pool
    if ref is None:
        return []
    try:
        raw = pools(namespace, ref.name)
    except Exception as exc:  # noqa: BLE001 - any failure to read it (API error, timeout)
        return [f"spec.generatorPool.name: Internal error: could not read GeneratorPool {ref.name!r} to check the "
                f"job against it ({type(exc).__name__}); try again"]
    if raw is None:
        return []
    if (raw.get("metadata") or {}).get("deletionTimestamp"):
        return [validate_pool.pool_deleted(ref.name)]
    try:
        pool = load.parse_pool({k: raw[k] for k in KEYS if k in raw})
    except load.InvalidRLJob as exc:
        return [f"spec.generatorPool.name: Invalid value: {ref.name!r}: the GeneratorPool is not valid: "
                f"{'; '.join(exc.problems)}"]
    return validate_pool.problems(job, pool)


def image_problems(spec: Mapping[str, Any], runtime: RuntimeImage) -> list[str]:
    """What of a valid ``spec`` the runtime image cannot run (the module docstring says why only this)."""
    env = spec.get("environment") or {}
    generator = (spec.get("roles") or {}).get("generator") or {}
    if env.get("type") != "Verifiers" or generator.get("image") or FEATURE_VERIFIERS in runtime.features:
        return []
    return [f"spec.environment.type: Forbidden: Verifiers runs the verifiers library in the generator pods, and "
            f"their image, the operator's runtime image {runtime.image}, does not carry it (its features: "
            f"{', '.join(sorted(runtime.features)) or 'none'}); set spec.roles.generator.image to an image with the "
            f"library, or run the operator with a runtime image that has it (--runtime-image-features "
            f"{FEATURE_VERIFIERS})"]


def message(problems: list[str]) -> str:
    """The denial the API server shows (``kubectl apply`` prints it after the webhook's name)."""
    return "; ".join(problems)


def respond(doc: Any, *, runtime: RuntimeImage | None = None, pools: PoolLookup | None = None) -> dict[str, Any]:
    """The AdmissionReview answering ``doc`` (a decoded AdmissionReview request); raises ``MalformedReview``."""
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview" or not isinstance(doc.get("request"), dict):
        raise MalformedReview("not an AdmissionReview with a request")
    req = doc["request"]
    uid, obj, old = req.get("uid"), req.get("object"), req.get("oldObject")
    if not isinstance(uid, str) or not uid or not isinstance(obj, dict) or not isinstance(old, (dict, type(None))):
        raise MalformedReview("the request has no uid or no object")
    problems = review(str(req.get("operation") or ""), obj, old, runtime=runtime, pools=pools,
                      namespace=str(req.get("namespace") or ""))
    response: dict[str, Any] = {"uid": uid, "allowed": not problems}
    if problems:
        response["status"] = {"code": DENIED_CODE, "message": message(problems)}
    return {"apiVersion": doc.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}
