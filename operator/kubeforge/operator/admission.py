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

Invariants: CREATE is always reviewed; an UPDATE only when the spec changed, so a job stored before the webhook
existed can still be annotated, have its status written, and be deleted. The denial message lists every problem
as ``path: message`` joined by ``; `` (one line, as the API server shows it).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from kubeforge.api import load

#: What a runtime image may carry beyond kubeforge and its roles (the operator's ``--runtime-image-features``):
#: ``verifiers``, the library's own interpreter (``KUBEFORGE_ENVS_PYTHON``) for ``environment.type: Verifiers``.
FEATURE_VERIFIERS = "verifiers"
FEATURES = (FEATURE_VERIFIERS,)

KEYS = ("apiVersion", "kind", "metadata", "spec")
DENIED_CODE = 422


class MalformedReview(ValueError):
    """The request is not an admission.k8s.io/v1 AdmissionReview with a request uid."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RuntimeImage:
    """The image of roles that name none (the operator's ``--runtime-image``) and what it carries (``FEATURES``)."""

    image: str
    features: frozenset[str]


def review(operation: str, body: Mapping[str, Any], old: Mapping[str, Any] | None = None, *,
           runtime: RuntimeImage | None = None) -> list[str]:
    """Problems that make ``body`` (the object as it would be stored) unacceptable; empty to admit it. With
    ``runtime``, also what that image cannot run (``image_problems``)."""
    if operation not in ("CREATE", "UPDATE"):
        return []
    if operation == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
        return []
    doc = {k: body[k] for k in KEYS if k in body}
    try:
        load.parse(doc)
    except load.InvalidRLJob as exc:
        return list(exc.problems)
    return image_problems(doc.get("spec") or {}, runtime) if runtime is not None else []


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


def respond(doc: Any, *, runtime: RuntimeImage | None = None) -> dict[str, Any]:
    """The AdmissionReview answering ``doc`` (a decoded AdmissionReview request); raises ``MalformedReview``."""
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview" or not isinstance(doc.get("request"), dict):
        raise MalformedReview("not an AdmissionReview with a request")
    req = doc["request"]
    uid, obj, old = req.get("uid"), req.get("object"), req.get("oldObject")
    if not isinstance(uid, str) or not uid or not isinstance(obj, dict) or not isinstance(old, (dict, type(None))):
        raise MalformedReview("the request has no uid or no object")
    problems = review(str(req.get("operation") or ""), obj, old, runtime=runtime)
    response: dict[str, Any] = {"uid": uid, "allowed": not problems}
    if problems:
        response["status"] = {"code": DENIED_CODE, "message": message(problems)}
    return {"apiVersion": doc.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}
