"""Puts ``lightkube_cluster.LightkubeCluster`` in place of ``apply.Cluster`` in a ``python -m kubeforge.operator``
process when ``KF_OPERATOR_CLIENT=lightkube`` (the A/B of issue 38 item 5; see ../lightkube_cluster.py). Any
other process (the bench itself, with its own watch on ``apply.Cluster``'s pool) is left alone."""
import os
import sys

if os.environ.get("KF_OPERATOR_CLIENT") == "lightkube" and sys.orig_argv[1:3] == ["-m", "kubeforge.operator"]:
    import lightkube_cluster

    from kubeforge.operator import apply

    apply.Cluster = lightkube_cluster.LightkubeCluster  # type: ignore[misc]
    print("API client: lightkube (bench/probes/lightkube_cluster.py)", file=sys.stderr, flush=True)
