"""The admission review is the launcher's validation (pure; the webhook on a real API server is
e2e/test_webhook_admission.py), and the self-signed certificate names the address the API server dials."""
from __future__ import annotations

import http.client
import json
import os
import pathlib
import ssl
import sys
import time

import pytest

from kubeforge.api import load
from kubeforge.operator import admission, metrics, webhook

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "api"))
import invalid_manifests  # noqa: E402


def test_create_reviews_every_rule_and_names_the_field() -> None:
    assert admission.review("CREATE", invalid_manifests.valid()) == []
    for case in invalid_manifests.SEMANTIC_CASES:
        problems = admission.review("CREATE", case.manifest())
        assert problems and all(p.startswith(case.path) for p in problems), (case.id, problems)
        assert case.message.lower() in admission.message(problems).lower()


@pytest.mark.parametrize("case", invalid_manifests.ALL_CASES, ids=lambda c: c.id)
def test_kubeforge_validate_and_the_review_refuse_with_the_same_lines(
        case: invalid_manifests.Case, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One refusal, two doors: ``kubeforge validate FILE`` prints exactly the problems the webhook denies with, each
    naming the case's field (the schema's rules and the cross-field rules alike; docs/validation.md)."""
    from kubeforge import cli

    path = tmp_path / "job.json"
    path.write_text(json.dumps(case.manifest()))
    assert cli.validate(str(path)) == cli.EXIT_INVALID == load.EXIT_INVALID
    prefix = f"kubeforge: {path}: "       # load.refusal: the lines `kubeforge run` prints too
    printed = [line.removeprefix(prefix) for line in capsys.readouterr().err.splitlines()]
    reviewed = admission.review("CREATE", case.manifest())
    assert printed == reviewed and reviewed, (case.id, printed, reviewed)
    assert all(p.startswith(case.path) for p in reviewed), (case.id, reviewed)
    assert case.message.lower() in admission.message(reviewed).lower(), (case.id, reviewed)


def test_update_is_reviewed_only_when_the_spec_changes() -> None:
    bad = invalid_manifests.SEMANTIC_CASES[0].manifest()
    annotated = {**bad, "metadata": {**bad["metadata"], "annotations": {"a": "b"}}}
    assert admission.review("UPDATE", annotated, bad) == []         # a job stored before the webhook stays usable
    assert admission.review("UPDATE", bad, invalid_manifests.valid())
    assert admission.review("DELETE", bad) == []


def test_the_self_signed_certificate_names_its_host(tmp_path: pathlib.Path) -> None:
    from cryptography import x509

    cert, key = webhook.self_signed("10.1.2.3", tmp_path)
    parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} == {"10.1.2.3", "127.0.0.1"}
    assert key.stat().st_mode & 0o077 == 0


def review_doc(obj: dict, *, uid: str = "u-1", operation: str = "CREATE") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "operation": operation, "object": obj, "oldObject": None}}


def test_respond_wraps_the_review_in_the_admission_envelope() -> None:
    ok = admission.respond(review_doc(invalid_manifests.valid(), uid="a"))
    assert ok == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "response": {"uid": "a", "allowed": True}}
    case = invalid_manifests.SEMANTIC_CASES[0]
    denied = admission.respond(review_doc(case.manifest(), uid="b"))["response"]
    assert denied["uid"] == "b" and denied["allowed"] is False and denied["status"]["code"] == 422
    assert case.message.lower() in denied["status"]["message"].lower()
    for bad in ({}, [], {"kind": "AdmissionReview"}, {"kind": "AdmissionReview", "request": {"object": {}}},
                {"kind": "AdmissionReview", "request": {"uid": "x", "object": "s"}}):
        with pytest.raises(admission.MalformedReview):
            admission.respond(bad)


def post(port: int, cafile: pathlib.Path, body: bytes, path: str = webhook.PATH) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(cafile))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def malformed_count() -> float:
    return metrics.ADMISSION.labels("malformed")._value.get()  # type: ignore[no-any-return]


def test_the_operators_own_https_server_answers_reviews(tmp_path: pathlib.Path) -> None:
    """What every replica (standbys too) serves in-cluster: real TLS, the envelope, malformed input dropped."""
    cert, key = webhook.self_signed("127.0.0.1", tmp_path)
    hook = webhook.Webhook(addr="127.0.0.1", port=0, host="127.0.0.1", certfile=str(cert), keyfile=str(key),
                           managed=False)
    server = webhook.AdmissionServer(hook).start()
    try:
        status, body = post(server.port, cert, json.dumps(review_doc(invalid_manifests.valid())).encode())
        assert status == 200 and json.loads(body)["response"] == {"uid": "u-1", "allowed": True}
        case = invalid_manifests.SEMANTIC_CASES[0]
        status, body = post(server.port, cert, json.dumps(review_doc(case.manifest())).encode())
        assert status == 200 and json.loads(body)["response"]["allowed"] is False
        before = malformed_count()
        assert post(server.port, cert, b"{not json")[0] == 400
        assert post(server.port, cert, b'{"kind": "Pod"}')[0] == 400
        assert malformed_count() == before + 2
        assert post(server.port, cert, b"{}", path="/elsewhere")[0] == 404
        # the kubelet rewrites a mounted Secret in place: the next connection uses the new certificate
        old = tmp_path / "old.crt"
        old.write_bytes(cert.read_bytes())
        other = tmp_path / "other"
        other.mkdir()
        cert2, key2 = webhook.self_signed("127.0.0.1", other)
        cert.write_bytes(cert2.read_bytes())
        key.write_bytes(key2.read_bytes())
        os.utime(cert, ns=(time.time_ns() + 10**9,) * 2)
        assert post(server.port, cert2, json.dumps(review_doc(invalid_manifests.valid())).encode())[0] == 200
        with pytest.raises(ssl.SSLError):
            post(server.port, old, b"{}")
    finally:
        server.stop()


def _verifiers_job(**generator: object) -> dict:
    import yaml

    doc = yaml.safe_load((pathlib.Path(__file__).resolve().parents[2] / "examples" / "tiny-verifiers.yaml").read_text())
    doc["spec"]["roles"]["generator"].update(generator)
    return doc


def test_verifiers_is_refused_where_the_runtime_image_lacks_the_library() -> None:
    """What the operator's runtime image cannot run is refused naming the field; the default image carries the
    library (images/runtime/Containerfile), and a generator's own image is the user's to vouch for."""
    from kubeforge.operator import main, names

    bare = admission.RuntimeImage(image="registry.example/kubeforge/runtime:0.1.0-gpu", features=frozenset())
    (problem,) = admission.review("CREATE", _verifiers_job(), runtime=bare)
    assert problem.startswith("spec.environment.type: Forbidden: Verifiers") and bare.image in problem
    assert "--runtime-image-features verifiers" in problem
    assert admission.review("CREATE", _verifiers_job(image="mine/with-verifiers:1"), runtime=bare) == []
    assert admission.review("CREATE", invalid_manifests.valid(), runtime=bare) == []   # no Verifiers environment
    default = main.runtime_image(main.parse_args([]))
    assert default.image == names.DEFAULT_RUNTIME_IMAGE and default.features == {admission.FEATURE_VERIFIERS}
    assert admission.review("CREATE", _verifiers_job(), runtime=default) == []
    assert main.runtime_image(main.parse_args(["--runtime-image-features", ""])).features == frozenset()
    out = admission.respond({"kind": "AdmissionReview", "request": {"uid": "u", "operation": "CREATE",
                                                                    "object": _verifiers_job()}}, runtime=bare)
    assert out["response"]["allowed"] is False and "Verifiers" in out["response"]["status"]["message"]


def test_an_unknown_runtime_image_feature_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from kubeforge.operator import main

    with pytest.raises(SystemExit):
        main.parse_args(["--runtime-image-features", "verifiers,cuda"])
    assert "--runtime-image-features: unknown cuda" in capsys.readouterr().err
