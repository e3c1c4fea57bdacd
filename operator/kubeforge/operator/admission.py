"""Admission review of RLJobs: the very checks of the local launcher (``kubeforge.api.load.parse``), as a pure
function of the object under review.

Neighbours: ``handlers`` registers it as kopf's validating webhook (``@kopf.on.validate``) and turns problems into a
denial; ``webhook`` serves it over HTTPS and registers it with the API server. The API server runs its CRD schema
and CEL rules first, so what reaches this review is schema-valid; the cross-field and semantic rules of
``kubeforge.api.validate`` (and any model validator CEL cannot express) decide here.

``respond`` wraps ``review`` in the AdmissionReview envelope (admission.k8s.io/v1) for the operator's own HTTPS
server (``webhook.AdmissionServer``, served by every replica, standbys included); kopf builds the envelope itself
when it serves the webhook.

Invariants: CREATE is always reviewed; an UPDATE only when the spec changed, so a job stored before the webhook
existed can still be annotated, have its status written, and be deleted. The denial message lists every problem
as ``path: message`` joined by ``; `` (one line, as the API server shows it).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubeforge.api import load

KEYS = ("apiVersion", "kind", "metadata", "spec")
DENIED_CODE = 422


class MalformedReview(ValueError):
    """The request is not an admission.k8s.io/v1 AdmissionReview with a request uid."""


def review(operation: str, body: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """Problems that make ``body`` (the object as it would be stored) unacceptable; empty to admit it."""
    if operation not in ("CREATE", "UPDATE"):
        return []
    if operation == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
        return []
    doc = {k: body[k] for k in KEYS if k in body}
    try:
        load.parse(doc)
    except load.InvalidRLJob as exc:
        return list(exc.problems)
    return []


def message(problems: list[str]) -> str:
    """The denial the API server shows (``kubectl apply`` prints it after the webhook's name)."""
    return "; ".join(problems)


def respond(doc: Any) -> dict[str, Any]:
    """The AdmissionReview answering ``doc`` (a decoded AdmissionReview request); raises ``MalformedReview``."""
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview" or not isinstance(doc.get("request"), dict):
        raise MalformedReview("not an AdmissionReview with a request")
    req = doc["request"]
    uid, obj, old = req.get("uid"), req.get("object"), req.get("oldObject")
    if not isinstance(uid, str) or not uid or not isinstance(obj, dict) or not isinstance(old, (dict, type(None))):
        raise MalformedReview("the request has no uid or no object")
    problems = review(str(req.get("operation") or ""), obj, old)
    response: dict[str, Any] = {"uid": uid, "allowed": not problems}
    if problems:
        response["status"] = {"code": DENIED_CODE, "message": message(problems)}
    return {"apiVersion": doc.get("apiVersion") or "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}
