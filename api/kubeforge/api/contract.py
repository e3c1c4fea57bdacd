"""The contract between the control plane and the data plane: names both sides must agree on.

Neighbours: the operator's renderers write these (env vars on pods, labels, annotations, ports); the runtime's
role entrypoints and the local launcher read or write them. Nothing else may spell these strings: import them.

Invariants:
- A role process is configured by the RLJob manifest (a file at ``ENV_CONFIG``) plus the env vars below; the same
  contract holds in a pod and in a local process (the launcher sets the very same variables).
- Every process listens on a block of ports starting at its ``ENV_PORT_BASE``; a named port is ``base + offset``.
  In a cluster every pod uses ``DEFAULT_PORT_BASE``; locally the launcher hands each process its own block.
- Peers are listed per role as ``host:portBase`` entries ordered by replica index.
"""
from __future__ import annotations

GROUP = "kubeforge.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "RLJob"
PLURAL = "rljobs"
SINGULAR = "rljob"
SHORT_NAMES = ("rlj",)
CATEGORIES = ("kubeforge", "all")

# The GeneratorPool kind (docs/generator-pool.md): vLLM engines shared by RLJobs that train LoRA adapters.
POOL_KIND = "GeneratorPool"
POOL_PLURAL = "generatorpools"
POOL_SINGULAR = "generatorpool"
POOL_SHORT_NAMES = ("gpool",)

ROLES = ("generator", "verifier", "trainer")
# The user's agent pods (spec.agent, docs/agents.md "Agents in their own pods"): not one of ROLES. They hold no
# gang place, no world size and no attempt of their own: an agent pod that dies costs its episodes only.
AGENT = "agent"
# The job's sandbox pods (spec.sandbox, docs/sandboxes.md): not one of ROLES either, and their pods do not carry
# LABEL_JOB (the job's NetworkPolicy admits the job's pods everywhere; a pod running model-written code is not one).
SANDBOX = "sandbox"

# ---- environment variables (one contract, pods and local processes alike) ----
ENV_PREFIX = "KUBEFORGE_"                    # every contract variable starts so; a role's own env may not
ENV_ROLE = "KUBEFORGE_ROLE"                  # generator | verifier | trainer
ENV_INDEX = "KUBEFORGE_INDEX"                # replica index within the role (StatefulSet ordinal)
ENV_CONFIG = "KUBEFORGE_CONFIG"              # path of the RLJob manifest (YAML or JSON)
ENV_JOB_NAME = "KUBEFORGE_JOB_NAME"
ENV_NAMESPACE = "KUBEFORGE_NAMESPACE"
ENV_POD_NAME = "KUBEFORGE_POD_NAME"          # set in pods only (downward API)
ENV_PORT_BASE = "KUBEFORGE_PORT_BASE"        # this process's first port
ENV_BIND_HOST = "KUBEFORGE_BIND_HOST"        # address to listen on (0.0.0.0 in pods, 127.0.0.1 locally)
ENV_RUN_DIR = "KUBEFORGE_RUN_DIR"            # where a role writes local artefacts (metrics JSONL, logs)
ENV_CHECKPOINT_DIR = "KUBEFORGE_CHECKPOINT_DIR"  # overrides spec.checkpoint.path (local runs)
ENV_ATTEMPT = "KUBEFORGE_ATTEMPT"            # restart attempt of the whole job (0 first)
ENV_TRAINER_EPOCH = "KUBEFORGE_TRAINER_EPOCH"  # trainers only: the epoch their writes carry (docs/fencing.md; 0 or
                                             # unset: unfenced); in pods read from LABEL_TRAINER_EPOCH
ENV_JOB_KEY = "KUBEFORGE_JOB_KEY"            # the job's secret (64 hex chars): CURVE keys and weight-sync auth
ENV_LOCAL_RANK = "KUBEFORGE_LOCAL_RANK"      # a trainer pod with N ranks: which one this process is (0..N-1),
                                             # set by the pod's own process on the N it starts (trainer/ranks.py)
ENV_REPORT = "KUBEFORGE_REPORT"              # "pod-annotation" in pods: the trainer reports progress on its pod
ENV_POOL = "KUBEFORGE_POOL"                  # a GeneratorPool's engine: the pool's name (its config is the pool's)
ENV_POOL_JOBS = "KUBEFORGE_POOL_JOBS"        # a pool engine: path of its attached jobs (JSON: generator.pool.attach)
ENV_POOL_KEY = "KUBEFORGE_POOL_KEY"          # a pool engine: path of the pool's key (64 hex; ``poolkeys``)
ENV_AGENT_KEY = "KUBEFORGE_AGENT_KEY"        # generators and agent pods of a job with spec.agent: the credential an
                                             # agent pod claims episodes with (never the job key)
ENV_POD_IP = "KUBEFORGE_POD_IP"              # generators of a job with spec.agent: the address the agents endpoint
                                             # binds (downward API status.podIP; 127.0.0.1 locally)
ENV_SANDBOX_KEY = "KUBEFORGE_SANDBOX_KEY"    # verifiers and sandbox pods of a job with spec.sandbox: the credential
                                             # of the sandbox protocol (never the job key)
ENV_SANDBOXES = "KUBEFORGE_PEERS_SANDBOX"    # verifiers of a job with spec.sandbox: the sandbox pods' host:portBase
ENV_CPUS = "KUBEFORGE_CPUS"                  # CPU ids ("0,2-3") the process pins itself to and sizes its threads by


def env_peers(role: str) -> str:
    """Env var listing the ``host:portBase`` of every replica of ``role``, comma-separated, by index."""
    return f"KUBEFORGE_PEERS_{role.upper()}"


def env_replicas(role: str) -> str:
    """Env var holding the replica count (world size) of ``role``."""
    return f"KUBEFORGE_{role.upper()}_REPLICAS"


# ---- stopping a trainer (SIGTERM: its pod deleted, e.g. the job suspended by a Kueue eviction or spec.suspend) ----
# One chain of bounds, each below the next: the trainer finishes the step in flight (or abandons the one it is
# collecting) and starts its stop checkpoint only while SIGTERM + the last write's duration stays within
# STOP_CHECKPOINT_WITHIN_SECONDS; the rank supervisor SIGKILLs ranks still running TRAINER_RANKS_GRACE_SECONDS after
# it forwarded SIGTERM; the kubelet SIGKILLs the pod TRAINER_TERMINATION_GRACE_SECONDS after SIGTERM (rendered as the
# trainer pods' terminationGracePeriodSeconds).
STOP_CHECKPOINT_WITHIN_SECONDS = 45
TRAINER_RANKS_GRACE_SECONDS = 50
TRAINER_TERMINATION_GRACE_SECONDS = 60

DEFAULT_PORT_BASE = 29500
PORT_METRICS = 0      # HTTP: /metrics, /healthz, /readyz
PORT_DATA = 1         # ZeroMQ: this role's input (verifier: rollouts; trainer: scored groups; generator: control)
PORT_CONTROL = 2      # ZeroMQ: control/ack channel
PORT_DIST = 3         # torch.distributed store of the trainers' data-parallel group (trainer 0)
PORT_WEIGHTS = 4      # torch.distributed store of the weight-sync group (trainer 0)
PORT_ENV = 5          # ZeroMQ: a verifier's environment server (generators' episodes step there: docs/agents.md)
PORT_AGENTS = 6       # HTTP: a generator's agents endpoint (spec.agent): episodes handed out, model calls served
PORT_SANDBOX = 7      # HTTP: a sandbox pod's claim/run/release protocol (spec.sandbox)
PORTS_PER_PROCESS = 10

# ---- labels and annotations (operator writes; runtime reads/writes where noted) ----
LABEL_JOB = "kubeforge.dev/job"                  # the RLJob's name, on every child and pod
LABEL_ROLE = "kubeforge.dev/role"                # generator | verifier | trainer
LABEL_ATTEMPT = "kubeforge.dev/attempt"          # restart attempt the pods belong to
LABEL_POOL = "kubeforge.dev/pool"                # the GeneratorPool's name, on every child and pod of a pool
LABEL_TRAINER_EPOCH = "kubeforge.dev/trainer-epoch"  # trainer pods: status.trainerEpoch when the pod was created
LABEL_SANDBOX_OF = "kubeforge.dev/sandbox-of"    # sandbox pods: the RLJob's name (instead of LABEL_JOB, on purpose)
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "kubeforge"
FIELD_MANAGER = "kubeforge-operator"

# The trainer (rank 0) reports progress on its own pod as a JSON annotation; the operator watches it.
ANNOTATION_PROGRESS = "kubeforge.dev/progress"   # a progress.ProgressReport (status.progress plus "done")

# Export on request: a new value of this annotation on the RLJob (the user's) asks for the current policy as an HF
# folder; the operator copies it onto trainer 0's pod of the current attempt while status.progress.lastExport has not
# served it, and the trainer reads it there (trainer/export_requests.py). The progress annotation then carries
# lastExport {request, path, step}, which the operator copies into status.progress.lastExport.
ANNOTATION_EXPORT_REQUEST = "kubeforge.dev/export-request"

# Kueue's labels, as users write them on every Kueue workload; on an RLJob they make it one (the operator's
# ``queueing``): its pods exist only while Kueue admits the job.
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"          # the LocalQueue in the RLJob's namespace
LABEL_KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"   # a WorkloadPriorityClass

JOB_KEY_SECRET_KEY = "key"                   # the data key holding ENV_JOB_KEY in the job's Secret


def job_key_secret(job: str) -> str:
    """Name of the per-job Secret holding the job key (created by the operator, owned by the RLJob)."""
    return f"{job}-key"


def agent_key_secret(job: str) -> str:
    """Name of the Secret holding ENV_AGENT_KEY (key ``JOB_KEY_SECRET_KEY``) of a job with spec.agent: drawn apart
    from the job key, so an agent pod, which gets only this one, can claim episodes and nothing else."""
    return f"{job}-agent-key"


def sandbox_key_secret(job: str) -> str:
    """Name of the Secret holding ENV_SANDBOX_KEY (key ``JOB_KEY_SECRET_KEY``) of a job with spec.sandbox: drawn
    apart from the job key; sandbox pods get only this one, which opens sandboxes and nothing else."""
    return f"{job}-sandbox-key"


# ---- what kubeforge reserves inside a role's pod (a user's volumes and mounts may not collide) ----
RESERVED_NAME_PREFIX = "kubeforge-"              # volume names kubeforge adds to every pod
RESERVED_MOUNT_DIR = "/etc/kubeforge"            # kubeforge's own mounts (the config, the job's secret)

# ---- children's names ----
MAX_JOB_NAME_LENGTH = 40  # "<name>-generator" must stay <= 52 chars (StatefulSet limit) with room to spare
MAX_POOL_NAME_LENGTH = 40  # "<name>-pool" likewise (the same limit as a job's: one rule to remember)


def child_name(job: str, role: str) -> str:
    """Deterministic name of a role's StatefulSet."""
    return f"{job}-{role}"


def service_name(job: str) -> str:
    """The job's one headless Service: every pod of every role is named under it (``peer_host``)."""
    return job


SURPLUS_GENERATORS = "gen-surplus"   # "<job>-gen-surplus": with MAX_JOB_NAME_LENGTH, 52 characters at most


def surplus_generators(job: str) -> str:
    """The StatefulSet of the generators beyond ``spec.roles.generator.minReplicas`` (not gang-held; its ordinals
    start at the minimum, so generator indexes stay contiguous across the two StatefulSets)."""
    return f"{job}-{SURPLUS_GENERATORS}"


def pod_name(job: str, role: str, index: int, *, gang_held: int | None = None) -> str:
    """The StatefulSet pod of ``role`` with ordinal ``index``; a generator at or beyond ``gang_held``
    (``GeneratorRole.gang_held()``) belongs to the surplus StatefulSet."""
    if role == "generator" and gang_held is not None and index >= gang_held:
        return f"{surplus_generators(job)}-{index}"
    return f"{child_name(job, role)}-{index}"


def sandbox_host(job: str, index: int, namespace: str) -> str:
    """Stable DNS name of sandbox pod ``index`` of a job with spec.sandbox: its StatefulSet and headless Service are
    both ``child_name(job, SANDBOX)`` (the job's own Service selects the job label, which sandbox pods lack)."""
    name = child_name(job, SANDBOX)
    return f"{name}-{index}.{name}.{namespace}.svc"


def peer_host(job: str, role: str, index: int, namespace: str, *, gang_held: int | None = None) -> str:
    """Stable DNS name of a pod behind the job's headless Service (a trainer finds a generator that joins a
    running job by it: generator replicas are elastic). Pod names are unique across roles, so one Service serves
    every role."""
    return f"{pod_name(job, role, index, gang_held=gang_held)}.{service_name(job)}.{namespace}.svc"


def pool_service(pool: str) -> str:
    """A GeneratorPool's headless Service and StatefulSet (one name for both); its engines are the pods
    ``<pool>-pool-<i>``. The suffix keeps them apart from the children of a job named like the pool."""
    return f"{pool}-pool"


def pool_peer_host(pool: str, index: int, namespace: str) -> str:
    """Stable DNS name of engine ``index`` of a pool: attached jobs list it as a generator peer."""
    return f"{pool_service(pool)}-{index}.{pool_service(pool)}.{namespace}.svc"
