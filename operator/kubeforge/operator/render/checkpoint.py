"""The trainer's checkpoint volume, mounted at ``spec.checkpoint.path``.

Role: the volume fragments of the trainer's pod and StatefulSet. Sources, by the spec:
- ``claimName``: that PersistentVolumeClaim in every trainer pod (it outlives pods and the job);
- ``volumeClaimTemplate``: a StatefulSet ``volumeClaimTemplates`` entry, so each trainer replica gets its own
  claim ``checkpoints-<job>-trainer-<i>``, kept while the job lives (pods going and the scale to 0 of a restart
  or completion keep it: a restarted trainer resumes from it, on any node the volume can reach) and deleted with
  the job (``persistentVolumeClaimRetentionPolicy.whenDeleted: Delete``; name a claim to keep checkpoints);
- neither: an ``emptyDir`` (the root filesystem is read-only), unless one of the trainer's own ``volumeMounts``
  is at the path already (then the user's volume serves, e.g. a hostPath in tests).
Invariant: exactly one mount at the checkpoint path; other roles get nothing.
"""
from __future__ import annotations

from kubeforge.api import contract, rljob
from kubeforge.operator.render import meta

VOLUME = "checkpoints"
ROLE = "trainer"


def _user_mounted(job: rljob.RLJob) -> bool:
    path = job.spec.checkpoint.path.rstrip("/") or "/"
    return any(str(m.get("mountPath", "")).rstrip("/") == path for m in job.spec.roles.trainer.volume_mounts)


def pod_volumes(job: rljob.RLJob, role: str) -> list[meta.Obj]:
    """Volumes of ``role``'s pod for checkpoints (a claim template is not a pod volume)."""
    ck = job.spec.checkpoint
    if role != ROLE or ck.volume_claim_template is not None:
        return []
    if ck.claim_name is not None:
        return [{"name": VOLUME, "persistentVolumeClaim": {"claimName": ck.claim_name}}]
    return [] if _user_mounted(job) else [{"name": VOLUME, "emptyDir": {}}]


def mounts(job: rljob.RLJob, role: str) -> list[meta.Obj]:
    """The checkpoint mount of ``role``'s container."""
    ck = job.spec.checkpoint
    if role != ROLE or (ck.claim_name is None and ck.volume_claim_template is None and _user_mounted(job)):
        return []
    return [{"name": VOLUME, "mountPath": ck.path}]


def claim_templates(job: rljob.RLJob, role: str) -> list[meta.Obj]:
    """``volumeClaimTemplates`` of ``role``'s StatefulSet."""
    t = job.spec.checkpoint.volume_claim_template
    if role != ROLE or t is None:
        return []
    spec: meta.Obj = {"accessModes": [str(m) for m in t.access_modes],
                      "resources": {"requests": {"storage": str(t.storage)}}}
    if t.storage_class_name:
        spec["storageClassName"] = t.storage_class_name
    return [{"metadata": {"name": VOLUME, "labels": {contract.LABEL_JOB: job.metadata.name}}, "spec": spec}]


def statefulset_fields(job: rljob.RLJob, role: str) -> meta.Obj:
    """The StatefulSet spec fields of the per-replica claims (none without a claim template)."""
    claims = claim_templates(job, role)
    if not claims:
        return {}
    return {"volumeClaimTemplates": claims,
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": "Retain"}}
