"""The env contract parsed once into a typed :class:`RoleConfig`, and the inverse the local launcher uses.

Neighbours: ``kubeforge.api.contract`` names every variable (the operator's renderer writes the same ones on
pods); ``kubeforge.api.load`` validates the manifest the variables point at; ``roles/`` read only a
``RoleConfig``; ``launcher/`` calls :func:`role_env` to produce each local process's environment.

Invariants:
- :func:`from_env` is the only place that reads ``os.environ``-style mappings in the runtime; it fails with one
  message per problem (naming the variable, or the manifest field path) before any socket is opened.
- :func:`role_env` and :func:`from_env` round-trip: ``from_env(role_env(...))`` describes the same process.
- Peers are ``host:portBase`` entries ordered by replica index; a named port is ``base + contract.PORT_*``.
- Trainer ranks: the env lists trainer *pods*; a pod with N ranks (``TrainerRole.ranks()``) holds ranks
  ``pod*N .. pod*N+N-1``, rank ``pod*N + l`` listening on the pod's port base + ``l * PORTS_PER_PROCESS``.
  :func:`from_env` expands ``peers["trainer"]`` to one entry per rank, so every role (verifiers send to each
  rank, generators to rank 0) sees the ranks, and a trainer process's ``index`` is its global rank. The pod's
  own process (no ``ENV_LOCAL_RANK``, N > 1) is the pod's supervisor (``supervises``): it starts the N ranks.
"""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping

from kubeforge.api import contract, load, rljob

REPORT_STDOUT = "stdout"
REPORT_JSONL = "jsonl"
REPORT_POD_ANNOTATION = "pod-annotation"
REPORT_KINDS = (REPORT_STDOUT, REPORT_JSONL, REPORT_POD_ANNOTATION)


class ConfigError(ValueError):
    """The environment does not describe a valid role process; ``problems`` holds one message per problem."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid role environment:\n" + "\n".join(f"  - {p}" for p in problems))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Peer:
    """One replica's address: a host and the first port of its block."""

    host: str
    port_base: int

    def port(self, offset: int) -> int:
        return self.port_base + offset

    def address(self, offset: int) -> str:
        """ZeroMQ/TCP address of the named port (``contract.PORT_*``)."""
        return f"tcp://{self.host}:{self.port(offset)}"

    def render(self) -> str:
        return f"{self.host}:{self.port_base}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoleConfig:
    """Everything a role process needs to know, parsed and validated once at start."""

    role: str
    index: int
    job: rljob.RLJob
    config_path: str
    job_name: str
    namespace: str | None
    pod_name: str | None
    port_base: int
    bind_host: str
    run_dir: pathlib.Path | None
    checkpoint_dir: str
    attempt: int
    report: str
    peers: Mapping[str, tuple[Peer, ...]]
    job_key: bytes | None = None   # ENV_JOB_KEY: CURVE on every socket and weight-sync auth (None: unauthenticated)
    pod_index: int = 0             # ENV_INDEX: the replica (pod) index
    local_rank: int | None = None  # ENV_LOCAL_RANK: trainer rank within its pod (None: not set)

    @property
    def supervises(self) -> bool:
        """A trainer pod's own process that must start the pod's N > 1 ranks (``roles/ranks.py``)."""
        return self.role == "trainer" and self.local_rank is None and self.spec.roles.trainer.ranks() > 1

    @property
    def spec(self) -> rljob.RLJobSpec:
        return self.job.spec

    def replicas(self, role: str) -> int:
        """World size of ``role`` (the number of peers listed for it)."""
        return len(self.peers[role])

    def port(self, offset: int) -> int:
        """This process's named port."""
        return self.port_base + offset

    def bind_address(self, offset: int) -> str:
        """Where this process listens for the named port."""
        return f"tcp://{self.bind_host}:{self.port(offset)}"

    def peer(self, role: str, index: int) -> Peer:
        return self.peers[role][index]

    @property
    def name(self) -> str:
        """``role-index``: the process's name in logs and metrics."""
        return f"{self.role}-{self.index}"


def _int(env: Mapping[str, str], key: str, problems: list[str], *, default: int | None = None,
         minimum: int = 0) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        if default is None:
            problems.append(f"{key}: Required value")
            return minimum
        return default
    try:
        value = int(raw)
    except ValueError:
        problems.append(f"{key}: Invalid value: {raw!r}: must be an integer")
        return minimum
    if value < minimum:
        problems.append(f"{key}: Invalid value: {value}: should be greater than or equal to {minimum}")
        return minimum
    return value


def parse_peers(raw: str, *, key: str, problems: list[str]) -> tuple[Peer, ...]:
    """``host:port,host:port`` → peers; one problem per malformed entry."""
    out: list[Peer] = []
    for i, entry in enumerate(x.strip() for x in raw.split(",") if x.strip()):
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            problems.append(f"{key}[{i}]: Invalid value: {entry!r}: must be host:port")
            continue
        out.append(Peer(host=host, port_base=int(port)))
    return tuple(out)


def _peers(env: Mapping[str, str], problems: list[str]) -> dict[str, tuple[Peer, ...]]:
    peers: dict[str, tuple[Peer, ...]] = {}
    for role in contract.ROLES:
        key = contract.env_peers(role)
        raw = env.get(key, "")
        if not raw:
            problems.append(f"{key}: Required value")
            peers[role] = ()
            continue
        peers[role] = parse_peers(raw, key=key, problems=problems)
        replicas_key = contract.env_replicas(role)
        if env.get(replicas_key) not in (None, "") and env[replicas_key] != str(len(peers[role])):
            problems.append(f"{replicas_key}: Invalid value: {env[replicas_key]!r}: {key} lists "
                            f"{len(peers[role])} peers")
    return peers


def _job(env: Mapping[str, str], problems: list[str]) -> tuple[rljob.RLJob | None, str]:
    path = env.get(contract.ENV_CONFIG, "")
    if not path:
        problems.append(f"{contract.ENV_CONFIG}: Required value")
        return None, path
    try:
        job = load.load_file(path)
    except FileNotFoundError:
        problems.append(f"{contract.ENV_CONFIG}: Not found: {path}")
        return None, path
    except load.InvalidRLJob as exc:
        problems.extend(exc.problems)
        return None, path
    problems.extend(local_problems(job.spec))
    return job, path


def local_problems(spec: rljob.RLJobSpec) -> list[str]:
    """What only this machine can check: the files a spec names exist here. (Every rule about the spec itself is
    ``kubeforge.api.validate``'s, run by ``load.parse``: on a cluster these paths are volumes, checked by no
    admission.) One message per problem."""
    problems: list[str] = []
    if spec.model.path is not None and not pathlib.Path(spec.model.path).is_dir():
        problems.append(f"spec.model.path: Not found: {spec.model.path!r} is not a directory")
    if spec.task.jsonl is not None and not pathlib.Path(spec.task.jsonl.path).is_file():
        problems.append(f"spec.task.jsonl.path: Not found: {spec.task.jsonl.path!r} is not a file")
    return problems


def from_env(env: Mapping[str, str]) -> RoleConfig:
    """Parse and validate the env contract (plus the manifest it names) or raise :class:`ConfigError`."""
    problems: list[str] = []
    role = env.get(contract.ENV_ROLE, "")
    if role not in contract.ROLES:
        problems.append(f"{contract.ENV_ROLE}: Unsupported value: {role!r}: supported values: "
                        f"{', '.join(contract.ROLES)}")
    index = _int(env, contract.ENV_INDEX, problems, default=0)
    port_base = _int(env, contract.ENV_PORT_BASE, problems, default=contract.DEFAULT_PORT_BASE, minimum=1)
    attempt = _int(env, contract.ENV_ATTEMPT, problems, default=0)
    report = env.get(contract.ENV_REPORT, "") or REPORT_STDOUT
    if report not in REPORT_KINDS:
        problems.append(f"{contract.ENV_REPORT}: Unsupported value: {report!r}: supported values: "
                        f"{', '.join(REPORT_KINDS)}")
    peers = _peers(env, problems)
    job_key = _job_key(env, problems)
    if role in contract.ROLES and peers.get(role) and index >= len(peers[role]):
        problems.append(f"{contract.ENV_INDEX}: Invalid value: {index}: {contract.env_peers(role)} lists only "
                        f"{len(peers[role])} replicas")
    job, path = _job(env, problems)
    if job is not None:
        problems.extend(_replica_problems(job, peers))
    local_rank = None
    if env.get(contract.ENV_LOCAL_RANK) not in (None, ""):
        local_rank = _int(env, contract.ENV_LOCAL_RANK, problems)
    if problems or job is None:
        raise ConfigError(problems)
    n = job.spec.roles.trainer.ranks()
    if local_rank is not None and (role != "trainer" or local_rank >= n):
        raise ConfigError([f"{contract.ENV_LOCAL_RANK}: Invalid value: {local_rank}: only trainer pods run several "
                           f"ranks (spec.roles.trainer ranks per pod: {n})"])
    pod_index = index
    peers = {**peers, "trainer": rank_peers(peers["trainer"], n)}
    if role == "trainer" and n > 1:
        index = pod_index * n + (local_rank or 0)
        port_base += (local_rank or 0) * contract.PORTS_PER_PROCESS
    run_dir = env.get(contract.ENV_RUN_DIR) or None
    return RoleConfig(
        role=role, index=index, job=job, config_path=path,
        job_name=env.get(contract.ENV_JOB_NAME) or job.metadata.name,
        namespace=env.get(contract.ENV_NAMESPACE) or None, pod_name=env.get(contract.ENV_POD_NAME) or None,
        port_base=port_base, bind_host=env.get(contract.ENV_BIND_HOST) or "0.0.0.0",
        run_dir=pathlib.Path(run_dir) if run_dir else None,
        checkpoint_dir=env.get(contract.ENV_CHECKPOINT_DIR) or job.spec.checkpoint.path,
        attempt=attempt, report=report, peers=peers, job_key=job_key, pod_index=pod_index, local_rank=local_rank,
    )


def rank_peers(pods: tuple[Peer, ...], ranks_per_pod: int) -> tuple[Peer, ...]:
    """One peer per trainer rank: pod ``i``'s rank ``l`` at the pod's port base + ``l * PORTS_PER_PROCESS``."""
    return tuple(Peer(host=p.host, port_base=p.port_base + local * contract.PORTS_PER_PROCESS)
                 for p in pods for local in range(ranks_per_pod))


def _job_key(env: Mapping[str, str], problems: list[str]) -> bytes | None:
    raw = env.get(contract.ENV_JOB_KEY, "")
    if not raw:
        return None
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) < 16:
        problems.append(f"{contract.ENV_JOB_KEY}: Invalid value: must be at least 32 hex characters")
        return None
    return key


def _replica_problems(job: rljob.RLJob, peers: Mapping[str, tuple[Peer, ...]]) -> list[str]:
    out = []
    for role in contract.ROLES:
        want = getattr(job.spec.roles, role).replicas
        if peers.get(role) and len(peers[role]) != want:
            out.append(f"{contract.env_peers(role)}: Invalid value: lists {len(peers[role])} peers but "
                       f"spec.roles.{role}.replicas is {want}")
    return out


def role_env(*, job: rljob.RLJob, config_path: str, role: str, index: int,
             peers: Mapping[str, list[Peer]], bind_host: str = "127.0.0.1", run_dir: str | None = None,
             checkpoint_dir: str | None = None, attempt: int = 0, report: str = REPORT_JSONL,
             job_key: bytes | None = None) -> dict[str, str]:
    """The env contract for one process: what the launcher sets locally and the operator sets on a pod (there the
    job key comes from the job's Secret)."""
    me = peers[role][index]
    env = {
        contract.ENV_ROLE: role,
        contract.ENV_INDEX: str(index),
        contract.ENV_CONFIG: config_path,
        contract.ENV_JOB_NAME: job.metadata.name,
        contract.ENV_PORT_BASE: str(me.port_base),
        contract.ENV_BIND_HOST: bind_host,
        contract.ENV_ATTEMPT: str(attempt),
        contract.ENV_REPORT: report,
    }
    for r in contract.ROLES:
        env[contract.env_peers(r)] = ",".join(p.render() for p in peers[r])
        env[contract.env_replicas(r)] = str(len(peers[r]))
    if run_dir:
        env[contract.ENV_RUN_DIR] = run_dir
    if checkpoint_dir:
        env[contract.ENV_CHECKPOINT_DIR] = checkpoint_dir
    if job_key:
        env[contract.ENV_JOB_KEY] = job_key.hex()
    return env
