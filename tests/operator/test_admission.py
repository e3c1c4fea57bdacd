"""The admission review is the launcher's validation (pure; the webhook on a real API server is
e2e/test_webhook_admission.py), and the self-signed certificate names the address the API server dials."""
from __future__ import annotations

import pathlib
import sys

from kubeforge.operator import admission, webhook

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "api"))
import invalid_manifests  # noqa: E402


def test_create_reviews_every_rule_and_names_the_field() -> None:
    assert admission.review("CREATE", invalid_manifests.valid()) == []
    for case in invalid_manifests.SEMANTIC_CASES:
        problems = admission.review("CREATE", case.manifest())
        assert problems and all(p.startswith(case.path) for p in problems), (case.id, problems)
        assert case.message.lower() in admission.message(problems).lower()


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
