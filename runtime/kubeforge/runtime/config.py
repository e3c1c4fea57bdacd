"""The env contract parsed once into a typed :class:`RoleConfig`, and the inverse the local launcher uses.

Neighbours: ``kubeforge.api.roleenv`` renders and parses the variables (the operator's renderer renders the same
ones for pods); ``kubeforge.api.load`` validates the manifest the variables point at; the roles read only a
``RoleConfig``; ``launcher/`` calls :func:`role_env` to produce each local process's environment.

Invariants:
- :func:`from_env` is the only place that parses the env contract in the runtime (through ``roleenv.read``); it
  fails with one message per problem (naming the variable, or the manifest field path) before any socket is opened.
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

from kubeforge.api import contract, load, rljob, roleenv
from kubeforge.runtime import modelfolder

class ConfigError(roleenv.EnvError):
    """The environment does not describe a valid role process; ``problems`` holds one message per problem."""


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
    peers: Mapping[str, tuple[roleenv.Peer, ...]]
    job_key: bytes | None = None   # ENV_JOB_KEY: CURVE on every socket and weight-sync auth (None: unauthenticated)
    pod_index: int = 0             # ENV_INDEX: the replica (pod) index
    local_rank: int | None = None  # ENV_LOCAL_RANK: trainer rank within its pod (None: not set)
    cpus: str | None = None        # ENV_CPUS: the CPU ids to pin to (affinity.apply_text); None: not pinned
    trainer_epoch: int = 0         # ENV_TRAINER_EPOCH: what a trainer's writes carry (docs/fencing.md)

    @property
    def supervises(self) -> bool:
        """A trainer pod's own process that must start the pod's N > 1 ranks (``trainer/ranks.py``)."""
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

    def peer(self, role: str, index: int) -> roleenv.Peer:
        return self.peers[role][index]

    @property
    def name(self) -> str:
        """``role-index``: the process's name in logs and metrics."""
        return f"{self.role}-{self.index}"


def _job(path: str, problems: list[str], *, role: str) -> rljob.RLJob | None:
    if not path:
        return None        # roleenv.read reported it
    try:
        job = load.load_file(path)
    except FileNotFoundError:
        problems.append(f"{contract.ENV_CONFIG}: Not found: {path}")
        return None
    except load.InvalidRLJob as exc:
        problems.extend(exc.problems)
        return None
    problems.extend(local_problems(job.spec, role=role or None))
    return job


#: The files of a spec each role reads itself (generators and trainers load the model; trainer rank 0 reads the
#: prompts; verifiers neither), so a pod needs only its own role's volumes (docs/guide.md, "Volumes per role").
READS: dict[str, frozenset[str]] = {
    "generator": frozenset({"model"}),
    "trainer": frozenset({"model", "task"}),
    "verifier": frozenset(),
}


def local_problems(spec: rljob.RLJobSpec, *, role: str | None = None) -> list[str]:
    """What only this machine can check: the files a spec names exist here, and a LoRA adapter's layers are in the
    model folder. (Every rule about the spec itself is
    ``kubeforge.api.validate``'s, run by ``load.parse``: on a cluster these paths are volumes, checked by no
    admission.) ``role``: only the files that role reads (:data:`READS`); None (the local launcher): every one.
    One message per problem."""
    reads = READS.get(role, frozenset()) if role is not None else frozenset({"model", "task"})
    problems: list[str] = []
    if "model" in reads and spec.model.path is not None and not pathlib.Path(spec.model.path).is_dir():
        problems.append(f"spec.model.path: Not found: {spec.model.path!r} is not a directory")
    if "model" in reads:
        # LoRA targets against the folder's weight names (safetensors headers, no torch): refused here, before any
        # model or vLLM engine loads, not by the trainer after its start (a built-in's layers: kubeforge.api.validate)
        problems.extend(modelfolder.lora_problems(spec.model))
        problems.extend(_native_problems(spec))
    if "task" in reads and spec.task.jsonl is not None and not pathlib.Path(spec.task.jsonl.path).is_file():
        problems.append(f"spec.task.jsonl.path: Not found: {spec.task.jsonl.path!r} is not a file")
    if role in (None, "generator") and spec.environment is not None and \
            spec.environment.type == rljob.EnvironmentType.VERIFIERS.value:
        # the generator runs the library's rollouts with it
        from kubeforge.runtime.agents.primeintellect import adapter

        python = adapter.default_python()
        if not python.exists():
            problems.append(f"spec.environment.type: Invalid value: 'Verifiers': needs the environments' interpreter "
                            f"with the verifiers library, and {str(python)!r} does not exist (make venv-envs, or set "
                            f"{adapter.ENV_PYTHON})")
    return problems


def _native_problems(spec: rljob.RLJobSpec) -> list[str]:
    """``toolFormat: Native`` with a ``spec.model.path`` model: its folder's chat template must write a tool-call
    format kubeforge reads (a built-in's: ``kubeforge.api.validate``). A folder that is not there is refused above."""
    env, path = spec.environment, spec.model.path
    if env is None or env.tool_format != rljob.ToolFormat.NATIVE.value or path is None or \
            not pathlib.Path(path).is_dir():
        return []
    from kubeforge.runtime.agents.toolcalls import registry

    if registry.for_template(modelfolder.chat_template(pathlib.Path(path))) is not None:
        return []
    return [f"spec.environment.toolFormat: Invalid value: 'Native': the chat template of the model at spec.model.path "
            f"writes no tool-call format kubeforge reads ({registry.families()}); use toolFormat Tags"]


def from_env(env: Mapping[str, str]) -> RoleConfig:
    """Parse and validate the env contract (plus the manifest it names) or raise :class:`ConfigError`."""
    e, problems = roleenv.read(env)
    job = _job(e.config_path, problems, role=e.role)
    if job is not None:
        problems.extend(_replica_problems(job, e.peers))
    if problems or job is None:
        raise ConfigError(problems)
    n = job.spec.roles.trainer.ranks()
    local_rank = e.local_rank
    if local_rank is not None and (e.role != "trainer" or local_rank >= n):
        raise ConfigError([f"{contract.ENV_LOCAL_RANK}: Invalid value: {local_rank}: only trainer pods run several "
                           f"ranks (spec.roles.trainer ranks per pod: {n})"])
    index, port_base = e.index, e.port_base
    if e.role == "trainer" and n > 1:
        index = e.index * n + (local_rank or 0)
        port_base += (local_rank or 0) * contract.PORTS_PER_PROCESS
    return RoleConfig(
        role=e.role, index=index, job=job, config_path=e.config_path, job_name=e.job_name or job.metadata.name,
        namespace=e.namespace, pod_name=e.pod_name, port_base=port_base, bind_host=e.bind_host,
        run_dir=pathlib.Path(e.run_dir) if e.run_dir else None,
        checkpoint_dir=e.checkpoint_dir or job.spec.checkpoint.path, attempt=e.attempt, report=e.report,
        peers={**e.peers, "trainer": rank_peers(e.peers["trainer"], n)}, job_key=e.job_key, pod_index=e.index,
        local_rank=local_rank, cpus=e.cpus, trainer_epoch=e.trainer_epoch,
    )


def rank_peers(pods: tuple[roleenv.Peer, ...], ranks_per_pod: int) -> tuple[roleenv.Peer, ...]:
    """One peer per trainer rank: pod ``i``'s rank ``l`` at the pod's port base + ``l * PORTS_PER_PROCESS``."""
    return tuple(roleenv.Peer(host=p.host, port_base=p.port_base + local * contract.PORTS_PER_PROCESS)
                 for p in pods for local in range(ranks_per_pod))


def _replica_problems(job: rljob.RLJob, peers: Mapping[str, tuple[roleenv.Peer, ...]]) -> list[str]:
    out = []
    for role in contract.ROLES:
        if role == "generator" and job.spec.generator_pool is not None:
            continue      # its generators are the pool's engines, as many as the pool runs (docs/generator-pool.md)
        want = getattr(job.spec.roles, role).replicas
        if peers.get(role) and len(peers[role]) != want:
            out.append(f"{contract.env_peers(role)}: Invalid value: lists {len(peers[role])} peers but "
                       f"spec.roles.{role}.replicas is {want}")
    return out


def role_env(*, job: rljob.RLJob, config_path: str, role: str, index: int,
             peers: Mapping[str, list[roleenv.Peer]], bind_host: str = "127.0.0.1", run_dir: str | None = None,
             checkpoint_dir: str | None = None, attempt: int = 0, report: str = roleenv.REPORT_JSONL,
             job_key: bytes | None = None, trainer_epoch: int | None = None) -> dict[str, str]:
    """The env contract for one local process (``roleenv.render`` with every value known here)."""
    env = roleenv.render(role=role, index=index, config_path=config_path, job_name=job.metadata.name, peers=peers,
                         port_base=peers[role][index].port_base, bind_host=bind_host, attempt=attempt,
                         report=report, job_key=job_key, run_dir=run_dir, checkpoint_dir=checkpoint_dir,
                         trainer_epoch=trainer_epoch if role == "trainer" else None)
    return {k: v for k, v in env.items() if isinstance(v, str)}
