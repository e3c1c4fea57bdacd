"""Two real nodes for a test module: kf-real-0 and kf-real-1 Ready in one cluster (issue 31; docs/node-loss.md).

``cluster()``: the session's (or ``make cluster-up REAL_NODES=2``'s) when it has two real nodes Ready; when it has
only kf-real-0, kf-real-1 is added to it (``e2e/node/extra-node.sh``, ~5 s) and removed at the end; with no cluster
and ``KUBEFORGE_REAL_NODE=1`` one is started (and stopped at the end). Skips, printing why, when the machine cannot
host a second node (``realnode.cannot_host_nodes``) or ``KF_SKIP_TWO_NODES=1``. Used by e2e/test_two_nodes.py and
e2e/test_fencing_real.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kfcluster import config as cfg
from kfcluster import lifecycle
from node import realnode

ASKED = os.environ.get("KUBEFORGE_REAL_NODE", "") in ("1", "true", "yes")
EXTRA_NODE = realnode.SCRIPTS_DIR / "extra-node.sh"


def _skip(reason: str) -> None:
    print(f"\n[two-nodes] SKIP: {reason}", file=sys.stderr, flush=True)
    pytest.skip(reason)


@contextlib.contextmanager
def cluster() -> Iterator[lifecycle.Cluster]:
    """A cluster with kf-real-0 and kf-real-1 Ready (reused, extended by node 1, or started here)."""
    if os.environ.get("KF_SKIP_TWO_NODES", "") in ("1", "true", "yes"):
        _skip("KF_SKIP_TWO_NODES is set")
    base = cfg.from_env()
    started = False
    try:
        running: lifecycle.Cluster | None = lifecycle.Cluster.load(base.workdir)
        if not running.kubectl.readyz():
            running = None
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        running = None
    ready = realnode.ready_real_nodes(running.kubectl) if running else []
    if len(ready) < 2:
        reason = realnode.cannot_host_nodes(2)
        if reason:
            _skip(f"this machine cannot host two real nodes: {reason}")
    if running is None:
        if not ASKED:
            _skip("no test cluster with real nodes: run `make cluster-up REAL_NODES=2` or set KUBEFORGE_REAL_NODE=1")
        os.environ.setdefault("KF_REAL_NODE_WAIT_S", "300")
        overrides = realnode.cluster_overrides(workdir=base.workdir, name=base.name)
        running = lifecycle.up(cfg.from_env(real_node=True, real_nodes=2, **overrides))
        started = True
        ready = realnode.ready_real_nodes(running.kubectl)
    added = False
    if len(ready) < 2:
        if realnode.NODE_NAME not in ready:
            if not ASKED:
                _skip(f"the test cluster in {running.workdir} has no real node and none was asked for (KUBEFORGE_REAL_NODE)")
            pytest.fail(f"real node {realnode.NODE_NAME} not Ready in {running.workdir}: {realnode.status(running.kubectl).reason}")
        subprocess.run(["bash", str(EXTRA_NODE), running.workdir, "1", "up"], check=True, timeout=180)
        added = True
    try:
        yield running
    finally:
        if added:
            subprocess.run(["bash", str(EXTRA_NODE), running.workdir, "1", "down"], check=False, timeout=180)
        if started:
            lifecycle.down(workdir=running.workdir)
