"""What the renderers know besides the spec: observed facts and operator settings, frozen.

Role: the second argument of every renderer. ``lifecycle`` decides these facts from the observed cluster; the
renderers stay pure functions of (RLJob, RenderContext). Invariant: the same inputs render the same objects, byte
for byte, so server-side apply of a replayed pass is a no-op.
"""
from __future__ import annotations

import dataclasses

from kubeforge.api import contract
from kubeforge.operator import names


@dataclasses.dataclass(frozen=True, kw_only=True)
class RenderContext:
    """Facts a render depends on.

    namespace/uid: the RLJob's namespace and UID (owner references).
    attempt: the restart attempt the pods belong to (labels and ``KUBEFORGE_ATTEMPT``).
    trainer_epoch: ``status.trainerEpoch``, the trainer pod template's label ``kubeforge.dev/trainer-epoch`` (and so
        its ``KUBEFORGE_TRAINER_EPOCH``): a change reaches only trainer pods created afterwards (``OnDelete``).
    active: pods should exist (False while suspended, finished, or while an old attempt drains).
    gang_active: the gang object should exist (False while suspended or finished; kept while an attempt drains).
    image: the role image used when a role names none.
    surplus_active: the surplus generators (beyond ``minReplicas``) may have pods: the gang is placed (every
        gang-held pod of the attempt is bound) or they already have pods in this attempt. Until then their
        StatefulSet has 0 replicas, so they cannot take the place of a gang member.
    surplus_present: pods of the surplus StatefulSet exist while the spec has none (``minReplicas`` removed): the
        StatefulSet must go.
    admission: a Kueue workload's admission (``queueing.admission_key``; "" when not one or not admitted): the
        spec rendered is then the job as admitted (``queueing.admitted_job``), and a new admission re-renders.
    gang_backend: for ``gang.backend: Auto``, the pod-level backend the operator chose (``gangauto.choose``:
        Coscheduling or None); "" (not resolved) renders as None. Ignored for an explicit backend.
    coscheduling_scheduler: the operator's setting naming the scheduler that serves PodGroups (chart value
        ``gang.coschedulingSchedulerName``): the ``schedulerName`` of Coscheduling pods; "" leaves it unset.
    image_pull_secrets: the operator's default ``imagePullSecrets`` of every role pod (chart value
        ``rolePods.imagePullSecrets``); a role's own list wins.
    pool_engines: for a job on a GeneratorPool (``spec.generatorPool``), the pool's engines (its
        ``spec.replicas``; 0 while the pool does not exist): the generators its roles dial.
    avoid_nodes: nodes the job's new pods must keep off (``peersilence.avoided``: a node that stopped answering,
        until it answers again); rendered as required node anti-affinity. Running pods are not rolled (``OnDelete``).
    pool_port_base: for a job on a GeneratorPool, the port base every engine serves it at (``poolports``: the pool's
        ``status.jobPorts``); ``contract.DEFAULT_PORT_BASE`` otherwise.
    key_secret: for a job on a GeneratorPool, the name of its key Secret (``names.pool_job_key_secret``: its
        derived key's fingerprint in the name); "" for ``contract.job_key_secret`` (a job with generators of its own).
    """

    namespace: str
    uid: str
    attempt: int = 0
    trainer_epoch: int = 1
    active: bool = True
    gang_active: bool = True
    image: str = names.DEFAULT_RUNTIME_IMAGE
    surplus_active: bool = True
    surplus_present: bool = False
    admission: str = ""
    gang_backend: str = ""
    coscheduling_scheduler: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    pool_engines: int = 0
    pool_port_base: int = contract.DEFAULT_PORT_BASE
    key_secret: str = ""
    avoid_nodes: tuple[str, ...] = ()
