"""e2e fixtures (see kfcluster.fixtures): one test cluster per pytest session, a namespace per test.

At import (collection) time this picks which cluster ``kfcluster.config.from_env()`` means for the whole
session, so fixtures of every module (and ``lifecycle.up()`` calls in them) share one cluster. A private
cluster started for this session is stopped when the session ends (``KF_KEEP_CLUSTER=1`` keeps it).
"""

from __future__ import annotations

import os

import pytest

from kfcluster import lifecycle
from kfcluster.fixtures import api_client, choose_session_cluster, kube_cluster, kueue_cluster, namespace  # noqa: F401

_PRIVATE_WORKDIR = choose_session_cluster(os.environ)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _PRIVATE_WORKDIR and os.environ.get("KF_KEEP_CLUSTER") != "1" and os.path.isdir(_PRIVATE_WORKDIR):
        lifecycle.down(workdir=_PRIVATE_WORKDIR)
