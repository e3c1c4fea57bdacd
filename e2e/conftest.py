"""e2e fixtures (see kfcluster.fixtures): one test cluster per pytest session, a namespace per test.

At import (collection) time this picks which cluster ``kfcluster.config.from_env()`` means for the whole
session, so fixtures of every module (and ``lifecycle.up()`` calls in them) share one cluster. A private
cluster started for this session is stopped when the session ends (``KF_KEEP_CLUSTER=1`` keeps it).

``cluster`` (module scope) is that cluster with its real node Ready, for the modules that run real pods
(test_e2e_real, test_guide_real, test_helm_install, test_realnode_smoke, test_secrets_real); e2e/test_two_nodes.py
has its own (two real nodes). ``real_node_cluster`` is the same with how it was got (started here, setup seconds).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from kfcluster import lifecycle
from kfcluster.fixtures import (  # noqa: F401
    api_client, choose_session_cluster, kube_cluster, kueue_cluster, namespace, scheduler_variant, stock_cluster)

if TYPE_CHECKING:
    import run_real

_PRIVATE_WORKDIR = choose_session_cluster(os.environ)
REAL_NODE_ASKED = os.environ.get("KUBEFORGE_REAL_NODE", "") in ("1", "true", "yes")


@pytest.fixture(scope="module")
def real_node_cluster() -> Iterator[run_real.Acquired]:
    """The session's cluster with its real node Ready (``run_real.acquire_cluster``): started with the real node
    when none runs and ``KUBEFORGE_REAL_NODE=1``; otherwise the module skips (fails when the node was asked for
    but is not usable). One started here that is not the session's private cluster (stopped at session end, so
    later modules still find it) is stopped after the module unless ``KF_KEEP_CLUSTER=1``."""
    import run_real

    got = run_real.acquire_cluster(start=REAL_NODE_ASKED)
    if isinstance(got, str):
        if REAL_NODE_ASKED:
            pytest.fail(f"real node requested but not usable: {got}")
        pytest.skip(f"{got}; or set KUBEFORGE_REAL_NODE=1")
    yield got
    private = got.cluster.name.startswith("kf-pytest-")
    if got.started and not private and os.environ.get("KF_KEEP_CLUSTER") != "1":
        lifecycle.down(workdir=got.cluster.workdir)


@pytest.fixture(scope="module")
def cluster(real_node_cluster: run_real.Acquired) -> lifecycle.Cluster:
    """The cluster of ``real_node_cluster`` (its real node Ready)."""
    return real_node_cluster.cluster


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PRIVATE_WORKDIR and os.environ.get("KF_KEEP_CLUSTER") != "1" and os.path.isdir(_PRIVATE_WORKDIR):
        lifecycle.down(workdir=_PRIVATE_WORKDIR)

