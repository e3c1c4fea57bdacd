"""The env contract of a role process: one pure render function and one parser, for pods and local processes alike.

```
 operator (render/env.py) ──┐                                  ┌──▶ runtime (config.from_env): + the manifest, ranks
                            ├─▶ render() ─▶ env ─▶ read()/parse()
 launcher (config.role_env) ┘   (names: contract.ENV_*)         └──▶ typed RoleEnv, one message per problem
```

- :func:`render` lists the variables in one order. A value is a string, or where a pod learns it from the API
  server, a :class:`FieldRef` (downward API) or a :class:`SecretRef` (the job's Secret); the operator turns those
  into ``valueFrom``, the local launcher passes strings only.
- :func:`read` parses a mapping of strings (``os.environ``) into a :class:`RoleEnv` plus one problem per bad
  variable, named as ``VARIABLE: Reason: detail``; :func:`parse` raises :class:`EnvError` instead. Nothing here
  reads a file: the manifest the env points at is the runtime's to load.

Invariant: ``read(render(...))`` (strings only) gives back what was rendered (tests/api/test_roleenv.py, and with
the operator's rendered env in tests/operator/test_render_units.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from kubeforge.api import contract

REPORT_STDOUT = "stdout"
REPORT_JSONL = "jsonl"
REPORT_POD_ANNOTATION = "pod-annotation"
REPORT_KINDS = (REPORT_STDOUT, REPORT_JSONL, REPORT_POD_ANNOTATION)
JOB_KEY_MIN_BYTES = 16


class EnvError(ValueError):
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


@dataclasses.dataclass(frozen=True)
class FieldRef:
    """A value a pod reads from its own object (``fieldRef.fieldPath``)."""

    path: str


@dataclasses.dataclass(frozen=True)
class SecretRef:
    """A value a pod reads from a Secret (``secretKeyRef``)."""

    name: str
    key: str


Value = str | FieldRef | SecretRef


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoleEnv:
    """The env contract, parsed (the manifest at ``config_path`` not loaded)."""

    role: str
    index: int
    config_path: str
    job_name: str | None
    namespace: str | None
    pod_name: str | None
    port_base: int
    bind_host: str
    run_dir: str | None
    checkpoint_dir: str | None
    attempt: int
    report: str
    peers: Mapping[str, tuple[Peer, ...]]
    job_key: bytes | None
    local_rank: int | None
    cpus: str | None = None      # ENV_CPUS as written ("0,2-3"); the runtime's affinity parses and applies it
    trainer_epoch: int = 0       # ENV_TRAINER_EPOCH: the epoch a trainer's writes carry (0: unfenced)


def render(*, role: str, index: int | FieldRef, config_path: str, job_name: str,
           peers: Mapping[str, Sequence[Peer]], port_base: int, bind_host: str, attempt: int, report: str,
           job_key: bytes | SecretRef | None = None, namespace: str | FieldRef | None = None,
           pod_name: str | FieldRef | None = None, run_dir: str | None = None,
           checkpoint_dir: str | None = None, trainer_epoch: int | FieldRef | None = None) -> dict[str, Value]:
    """The contract's variables for one process, in a fixed order; unset optional ones are left out."""
    env: dict[str, Value | None] = {
        **identity(role=role, index=index, config_path=config_path, job_name=job_name, namespace=namespace,
                   pod_name=pod_name, port_base=port_base, bind_host=bind_host),
        contract.ENV_ATTEMPT: str(attempt),
        contract.ENV_TRAINER_EPOCH: str(trainer_epoch) if isinstance(trainer_epoch, int) else trainer_epoch,
        contract.ENV_REPORT: report,
        contract.ENV_JOB_KEY: job_key.hex() if isinstance(job_key, bytes) else job_key,
    }
    for other in contract.ROLES:
        env[contract.env_replicas(other)] = str(len(peers[other]))
        env[contract.env_peers(other)] = ",".join(p.render() for p in peers[other])
    env[contract.ENV_RUN_DIR] = run_dir
    env[contract.ENV_CHECKPOINT_DIR] = checkpoint_dir
    return {k: v for k, v in env.items() if v is not None and v != ""}


def identity(*, role: str, index: int | FieldRef, config_path: str, job_name: str,
             namespace: str | FieldRef | None, pod_name: str | FieldRef | None, port_base: int,
             bind_host: str) -> dict[str, Value | None]:
    """Who a process is and where it listens: the first variables of every kubeforge process (a role's, and an
    agent pod's: ``agentenv``)."""
    return {
        contract.ENV_ROLE: role,
        contract.ENV_INDEX: index if isinstance(index, FieldRef) else str(index),
        contract.ENV_CONFIG: config_path,
        contract.ENV_JOB_NAME: job_name,
        contract.ENV_NAMESPACE: namespace,
        contract.ENV_POD_NAME: pod_name,
        contract.ENV_PORT_BASE: str(port_base),
        contract.ENV_BIND_HOST: bind_host,
    }


def read(env: Mapping[str, str]) -> tuple[RoleEnv, list[str]]:
    """The contract parsed as far as it goes, and one message per problem (none: it is valid)."""
    problems: list[str] = []
    role = env.get(contract.ENV_ROLE, "")
    if role not in contract.ROLES:
        problems.append(f"{contract.ENV_ROLE}: Unsupported value: {role!r}: supported values: "
                        f"{', '.join(contract.ROLES)}")
    index = _int(env, contract.ENV_INDEX, problems, default=0)
    port_base = _int(env, contract.ENV_PORT_BASE, problems, default=contract.DEFAULT_PORT_BASE, minimum=1)
    attempt = _int(env, contract.ENV_ATTEMPT, problems, default=0)
    trainer_epoch = _int(env, contract.ENV_TRAINER_EPOCH, problems, default=0)
    report = env.get(contract.ENV_REPORT, "") or REPORT_STDOUT
    if report not in REPORT_KINDS:
        problems.append(f"{contract.ENV_REPORT}: Unsupported value: {report!r}: supported values: "
                        f"{', '.join(REPORT_KINDS)}")
    peers = _peers(env, problems)
    key = job_key(env.get(contract.ENV_JOB_KEY, ""), problems)
    if role in contract.ROLES and peers.get(role) and index >= len(peers[role]):
        problems.append(f"{contract.ENV_INDEX}: Invalid value: {index}: {contract.env_peers(role)} lists only "
                        f"{len(peers[role])} replicas")
    path = env.get(contract.ENV_CONFIG, "")
    if not path:
        problems.append(f"{contract.ENV_CONFIG}: Required value")
    local_rank = None
    if env.get(contract.ENV_LOCAL_RANK) not in (None, ""):
        local_rank = _int(env, contract.ENV_LOCAL_RANK, problems)
    return RoleEnv(
        role=role, index=index, config_path=path, job_name=env.get(contract.ENV_JOB_NAME) or None,
        namespace=env.get(contract.ENV_NAMESPACE) or None, pod_name=env.get(contract.ENV_POD_NAME) or None,
        port_base=port_base, bind_host=env.get(contract.ENV_BIND_HOST) or "0.0.0.0",
        run_dir=env.get(contract.ENV_RUN_DIR) or None, checkpoint_dir=env.get(contract.ENV_CHECKPOINT_DIR) or None,
        attempt=attempt, report=report, peers=peers, job_key=key, local_rank=local_rank,
        cpus=env.get(contract.ENV_CPUS) or None, trainer_epoch=trainer_epoch,
    ), problems


def parse(env: Mapping[str, str]) -> RoleEnv:
    """:func:`read`, or :class:`EnvError` with every problem."""
    parsed, problems = read(env)
    if problems:
        raise EnvError(problems)
    return parsed


def job_key(raw: str, problems: list[str]) -> bytes | None:
    """``ENV_JOB_KEY``'s value: None when unset (unauthenticated), else at least 16 bytes of hex."""
    if not raw:
        return None
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b""
    if len(key) < JOB_KEY_MIN_BYTES:
        problems.append(f"{contract.ENV_JOB_KEY}: Invalid value: must be at least {2 * JOB_KEY_MIN_BYTES} hex "
                        f"characters")
        return None
    return key


def secret_key(env: Mapping[str, str], name: str, problems: list[str]) -> bytes:
    """A required key of at least ``JOB_KEY_MIN_BYTES`` bytes of hex in variable ``name`` (the agent key, the
    sandbox key); b"" and a problem naming the variable otherwise."""
    try:
        key = bytes.fromhex(env.get(name, ""))
    except ValueError:
        key = b""
    if len(key) < JOB_KEY_MIN_BYTES:
        problems.append(f"{name}: Invalid value: must be at least {2 * JOB_KEY_MIN_BYTES} hex characters")
    return key


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
