"""Names the operator alone spells: child object names, operator-only labels and annotations, mount paths.

Role: the single home of every string the operator writes that the runtime never reads (those live in
``kubeforge.api.contract``). Neighbours: ``render/`` builds objects with these names; ``observed`` and ``status``
read them back. Invariants: every child name is a pure function of the RLJob's name, so replaying a reconcile
creates nothing twice; the longest child names (``<job>-generator``, ``<job>-gen-surplus``) fit the StatefulSet
limit because the CRD caps the job name at ``contract.MAX_JOB_NAME_LENGTH``.
"""
from __future__ import annotations

from kubeforge.api import contract

# ---- operator-only labels and annotations ----
#: Replica counts the pod was rendered for ("generator=2,verifier=1,trainer=1"); a pod of another world is stale.
ANNOTATION_WORLD = "kubeforge.dev/world"
#: On the pods (and in the selector) of the surplus generators' StatefulSet (``contract.surplus_generators``): the
#: generators beyond ``spec.roles.generator.minReplicas``, outside the gang. The gang-held StatefulSet's selector
#: (job and role) also matches them, but the StatefulSet controller claims no pod another controller owns.
LABEL_SURPLUS = "kubeforge.dev/surplus"
#: Downward-API label the StatefulSet controller puts on every pod (Kubernetes >= 1.28).
LABEL_POD_INDEX = "apps.kubernetes.io/pod-index"

# ---- the runtime config mount ----
CONFIG_DIR = contract.RESERVED_MOUNT_DIR
CONFIG_FILE = "rljob.yaml"
CONFIG_PATH = f"{CONFIG_DIR}/{CONFIG_FILE}"
CONFIG_VOLUME = f"{contract.RESERVED_NAME_PREFIX}config"

#: Image of the role containers when the role sets none (overridable by the operator's --runtime-image flag): the
#: CPU runtime image as `make images` names it (`make images REGISTRY=...` pushes it under the registry's name).
DEFAULT_RUNTIME_IMAGE = "kubeforge.local/runtime:0.1.0-cpu"
#: What that image carries beyond kubeforge (``admission.FEATURES``; the operator's --runtime-image-features):
#: images/runtime/Containerfile installs the verifiers library in a venv of its own.
DEFAULT_RUNTIME_FEATURES = ("verifiers",)

# ---- named ports (offsets from contract.DEFAULT_PORT_BASE) ----
PORT_NAMES = {
    "metrics": contract.PORT_METRICS,
    "data": contract.PORT_DATA,
    "control": contract.PORT_CONTROL,
    "dist": contract.PORT_DIST,
    "weights": contract.PORT_WEIGHTS,
}


def config_map(job: str) -> str:
    """The ConfigMap that holds the runtime config (the RLJob manifest)."""
    return f"{job}-config"


def service_account(job: str) -> str:
    """The per-job ServiceAccount, Role and RoleBinding (one name for all three)."""
    return f"{job}-runtime"


def pod_group(job: str) -> str:
    """The gang object (PodGroup or workload) spanning every role."""
    return job


def workload(job: str) -> str:
    """Kueue's Workload of a job labelled ``kueue.x-k8s.io/queue-name`` (``render.workload``)."""
    return job


def grow_workload(job: str, ordinal: int) -> str:
    """The Workload asking Kueue for generator ``ordinal`` beyond a partial admission (``queueing.growth``); the dot
    keeps it apart from every job's own Workload (RLJob names are DNS-1035 labels: no dot)."""
    return f"{job}.generator-{ordinal}"


pod = contract.pod_name            # replica ``index`` of ``role`` (StatefulSet ordinal naming)
peer_host = contract.peer_host     # stable DNS name of a pod behind the job's headless Service


def network_policy(job: str) -> str:
    """The job's NetworkPolicy."""
    return f"{job}-network"


# ---- a GeneratorPool's children (its StatefulSet and Service: ``contract.pool_service``) ----
POOL_CONFIG_FILE = "pool.yaml"           # the pool's manifest, as the engines read it
POOL_ENGINE_FILE = "engine.json"         # the vLLM arguments the spec decides (``generatorpool.engine_args``)
POOL_JOBS_FILE = "jobs.json"             # the attached jobs (``generator.pool.attach``): ``<pool>-pool-jobs``
POOL_KEY_FILE = "pool.key"              # the pool's key (64 hex; ``kubeforge.api.poolkeys``): ``pool_key_secret``
#: The finalizer on every GeneratorPool: a deleted pool waits until no RLJob names it (docs/generator-pool.md).
POOL_FINALIZER = "kubeforge.dev/pool-in-use"


def pool_config_map(pool: str) -> str:
    """The ConfigMap holding a pool's manifest and engine arguments."""
    return f"{contract.pool_service(pool)}-config"


def pool_jobs_config_map(pool: str) -> str:
    """The ConfigMap listing a pool's attached jobs (``POOL_JOBS_FILE``) and holding their manifests."""
    return f"{contract.pool_service(pool)}-jobs"


def pool_key_secret(pool: str, key_id: str) -> str:
    """The Secret holding a pool's key (``POOL_KEY_FILE``), mounted by its engines only; named by the key's
    fingerprint (``poolkeys.key_id``), so that a Secret of that name holds that key and no other."""
    return f"{contract.pool_service(pool)}-key-{key_id}"


def pool_job_key_secret(job: str, key_id: str) -> str:
    """The key Secret of a job attached to a GeneratorPool: ``<job>-key-<key id>``, its derived key's fingerprint
    in the name (docs/generator-pool.md, "Keys": why not ``<job>-key``)."""
    return f"{contract.job_key_secret(job)}-{key_id}"


def pool_job_manifest(job: str) -> str:
    """The file (a key of ``pool_jobs_config_map``) holding attached job ``job``'s manifest: the prefix keeps it
    apart from the other files of the engines' config folder, whatever the job is called."""
    return f"job-{job}.yaml"
