"""Flags of ``kubeforge operator``: namespace scoping and defaults."""
from __future__ import annotations

import pytest

from kubeforge.operator import main


def test_default_is_all_namespaces() -> None:
    opts = main.parse_args([])
    assert opts.all_namespaces and opts.namespaces == () and opts.log_format == "json"


def test_repeated_namespaces_scope_the_operator() -> None:
    opts = main.parse_args(["-n", "a", "--namespace", "b", "--metrics-port", "0"])
    assert opts.namespaces == ("a", "b") and not opts.all_namespaces and opts.metrics_port == 0


def test_namespace_and_all_namespaces_conflict() -> None:
    with pytest.raises(SystemExit):
        main.parse_args(["-n", "a", "-A"])


def test_role_pod_defaults_from_the_chart() -> None:
    """The chart's gang.coschedulingSchedulerName and rolePods.imagePullSecrets (templates/deployment.yaml)."""
    assert (main.parse_args([]).coscheduling_scheduler, main.parse_args([]).image_pull_secrets) == ("", ())
    opts = main.parse_args(["--coscheduling-scheduler-name=default-scheduler", "--image-pull-secret=a",
                            "--image-pull-secret", "b"])
    assert opts.coscheduling_scheduler == "default-scheduler" and opts.image_pull_secrets == ("a", "b")
