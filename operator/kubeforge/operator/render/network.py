"""The job's NetworkPolicy: only the job's own pods reach its role ports; metrics stay open to scrapers.

Role: one ``NetworkPolicy`` ``<job>-network`` selecting every pod of the job (``contract.LABEL_JOB``). Ingress:
- from pods of the same job (same namespace, same job label): every port. The roles' named ports (data,
  control, dist, weights) are only where groups meet: gloo's pairs connect on ephemeral ports, so a port list
  would break the trainers' group and weight sync;
- from anywhere: the ``metrics`` port only (Prometheus scrapes ``/metrics``; the kubelet's probes use it too);
- on a GeneratorPool (``spec.generatorPool``): from the pool's engines (``contract.LABEL_POOL``), every port: they
  deliver rollouts and join the trainer's weight sync as the job's own generators would.
Egress is not restricted (roles resolve names, trainer rank 0 calls the API server). Enforced only by a CNI that
implements NetworkPolicy (Calico, Cilium, Antrea, kube-router, Weave); the plain bridge CNI ignores it (the test
cluster's real nodes add kube-router's enforcer: e2e/node/netpol.sh, checked by e2e/test_two_nodes.py).
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator import names
from kubeforge.operator.render import context, meta


def network_policy(job: rljob.RLJob, ctx: context.RenderContext) -> meta.Obj:
    """The NetworkPolicy ``<job>-network``."""
    own = {"matchLabels": {contract.LABEL_JOB: job.metadata.name}}
    peers = [{"podSelector": own}]
    if job.spec.generator_pool is not None:
        peers.append({"podSelector": {"matchLabels": {contract.LABEL_POOL: job.spec.generator_pool.name}}})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": meta.metadata(job, ctx, name=names.network_policy(job.metadata.name)),
        "spec": {
            "podSelector": own,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": peers},
                {"ports": [{"protocol": "TCP", "port": contract.DEFAULT_PORT_BASE + contract.PORT_METRICS}]},
            ],
        },
    }
