"""Root conftest: make the test-cluster package ``kfcluster`` (in e2e/) importable from every test tree.

Shared cluster fixtures live in e2e/conftest.py; tests outside e2e/ that need the cluster can use them via
``from kfcluster.fixtures import kube_cluster, namespace, api_client``.
"""

import pathlib
import sys

_E2E = str(pathlib.Path(__file__).resolve().parent / "e2e")
if _E2E not in sys.path:
    sys.path.insert(0, _E2E)
