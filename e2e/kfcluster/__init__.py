"""kfcluster: the kubeforge test cluster (real control plane + kwok GPU nodes) for Make and pytest.

Public surface: ``up(config)``, ``down(workdir=...)``, ``add_nodes(cluster, pools)``, ``ClusterConfig``,
``NodePool``, ``Cluster``, ``from_env``. See docs/test-cluster.md for the work-dir layout and knobs.
Importable from the dev venv (``e2e/pyproject.toml``, installed editable by ``make venv``), in pytest (``pythonpath``
in pyproject.toml), and with ``PYTHONPATH=e2e`` (``make cluster-up``, the system Python); stdlib only.
"""

from kfcluster.config import ClusterConfig, NodePool, from_env
from kfcluster.lifecycle import Cluster, add_nodes, down, up

__all__ = ["Cluster", "ClusterConfig", "NodePool", "add_nodes", "down", "from_env", "up"]
