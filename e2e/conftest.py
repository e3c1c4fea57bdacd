"""e2e fixtures (see kfcluster.fixtures): one test cluster per pytest session, a namespace per test.

At import (collection) time this picks which cluster ``kfcluster.config.from_env()`` means for the whole
session, so fixtures of every module (and ``lifecycle.up()`` calls in them) share one cluster. A private
cluster started for this session is stopped when the session ends (``KF_KEEP_CLUSTER=1`` keeps it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from kfcluster import lifecycle
from kfcluster.fixtures import api_client, choose_session_cluster, kube_cluster, kueue_cluster, namespace  # noqa: F401

_PRIVATE_WORKDIR = choose_session_cluster(os.environ)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PRIVATE_WORKDIR and os.environ.get("KF_KEEP_CLUSTER") != "1" and os.path.isdir(_PRIVATE_WORKDIR):
        lifecycle.down(workdir=_PRIVATE_WORKDIR)


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[Any]:
    """The session's cluster with its real kubelet node Ready (``run_real.acquire_cluster``: its ``cluster``, and
    ``setup_seconds`` when started here). With
    ``KUBEFORGE_REAL_NODE=1`` one is started when none runs, and an unusable real node is a failure; otherwise the
    module skips, saying why. A cluster started here that is not the session's private one is stopped after the
    module (``KF_KEEP_CLUSTER=1`` keeps it); the private one (kf-pytest-<pid>) is left to the session's end, so
    suites that run later still find it."""
    import run_real

    asked = os.environ.get("KUBEFORGE_REAL_NODE", "") in ("1", "true", "yes")
    got = run_real.acquire_cluster(start=asked)
    if isinstance(got, str):
        if asked:
            pytest.fail(f"real node requested but not usable: {got}")
        pytest.skip(f"{got}; or set KUBEFORGE_REAL_NODE=1")
    yield got
    private = got.cluster.name.startswith("kf-pytest-")
    if got.started and not private and os.environ.get("KF_KEEP_CLUSTER") != "1":
        lifecycle.down(workdir=got.cluster.workdir)
