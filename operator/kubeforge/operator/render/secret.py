"""The job's Secret: the job key every role pod gets as ``contract.ENV_JOB_KEY`` (ZeroMQ CURVE and weight-sync
rendezvous authentication, docs/security.md).

Role: pure given the key; the key itself is drawn once by ``reconcile`` (``secrets.token_hex``), or for a job on a
GeneratorPool derived from the pool's key (``kubeforge.api.poolkeys``; the Secret is then
``names.pool_job_key_secret``, named by the key's fingerprint: ``RenderContext.key_secret``), and the Secret is
created only when absent (``apply.Cluster.create_if_absent``), never re-applied nor read back, so the key never
changes under running pods. Owned by the RLJob: deleting the job deletes it.
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator.render import context, meta


def job_key_secret(job: rljob.RLJob, ctx: context.RenderContext, *, key_hex: str) -> meta.Obj:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": meta.metadata(job, ctx, name=ctx.key_secret or contract.job_key_secret(job.metadata.name)),
        "stringData": {contract.JOB_KEY_SECRET_KEY: key_hex},
    }
