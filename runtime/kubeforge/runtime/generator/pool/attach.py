"""What a pool engine knows of the jobs attached to it: two files, named by the env contract.

``KUBEFORGE_POOL_JOBS`` (a ConfigMap on a cluster; written by ``kubeforge run`` locally)::

    {"jobs": [{"name": "job-a", "manifest": "/run/job-a/rljob.yaml", "portBases": [23010],
               "peers": {"trainer": ["127.0.0.1:23020"], "verifier": ["127.0.0.1:23030"]}}]}

``portBases[i]``: where engine ``i`` serves this job (its data port is ``portBase + contract.PORT_DATA``; the job's
``KUBEFORGE_PEERS_GENERATOR`` lists the same ``host:portBase`` entries); ``peers``: the job's trainer pods and
verifiers, as in the job's own env contract (``host:portBase``).

``KUBEFORGE_POOL_KEYS`` (a Secret: ``<pool>-pool-keys``)::  ``{"job-a": "<64 hex>", "job-b": "..."}``

Role: :func:`read` parses both into :class:`Attached` records for ``generator.pool.start``; bad input is a
:class:`AttachError` with one message per problem, naming the file and the field. Invariant: every attached job has
a key (a pool never serves a job unauthenticated), and its manifest names this pool and trains an adapter.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from kubeforge.api import load, rljob, roleenv


class AttachError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclasses.dataclass(frozen=True, kw_only=True)
class Attached:
    """One attached job, as engine ``index`` serves it."""

    name: str
    job: rljob.RLJob
    key: bytes
    port_base: int                      # this engine's for the job
    trainers: tuple[roleenv.Peer, ...]
    verifiers: tuple[roleenv.Peer, ...]

    @property
    def spec(self) -> rljob.RLJobSpec:
        return self.job.spec

    @property
    def weight(self) -> int:
        """Its fair-share weight: the completions it needs per step (``generator.pool.fairshare``)."""
        return self.spec.algorithm.prompts_per_step * self.spec.algorithm.group_size


def read(*, jobs_path: str, keys_path: str, pool: str, index: int) -> list[Attached]:
    """The jobs engine ``index`` of ``pool`` serves (see the module docstring)."""
    problems: list[str] = []
    jobs_doc = _json(jobs_path, problems)
    keys_doc = _json(keys_path, problems)
    if problems:
        raise AttachError(problems)
    out = []
    entries = jobs_doc.get("jobs") if isinstance(jobs_doc, dict) else None
    if not isinstance(entries, list):
        raise AttachError([f"{jobs_path}: jobs: Required value: a list of attached jobs"])
    for i, entry in enumerate(entries):
        got = _one(entry, keys=keys_doc, where=f"{jobs_path}: jobs[{i}]", keys_path=keys_path, pool=pool,
                   index=index, problems=problems)
        if got is not None:
            out.append(got)
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        problems.append(f"{jobs_path}: jobs: Duplicate value: a job is attached once")
    if problems:
        raise AttachError(problems)
    return out


def _json(path: str, problems: list[str]) -> Any:
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"{path}: cannot be read as JSON: {exc}")
        return None


def _one(entry: Any, *, keys: Any, where: str, keys_path: str, pool: str, index: int,
         problems: list[str]) -> Attached | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        problems.append(f"{where}.name: Required value")
        return None
    name = entry["name"]
    key = _key(keys.get(name) if isinstance(keys, dict) else None)
    if key is None:
        problems.append(f"{keys_path}: {name}: Required value: the job's key, at least "
                        f"{2 * roleenv.JOB_KEY_MIN_BYTES} hex characters (a pool serves no job unauthenticated)")
    bases = entry.get("portBases")
    if not isinstance(bases, list) or len(bases) <= index or not isinstance(bases[index], int):
        problems.append(f"{where}.portBases: Invalid value: needs an integer port base for engine {index}")
        return None
    try:
        job = load.load_file(str(entry.get("manifest", "")))
    except (load.InvalidRLJob, OSError) as exc:
        problems.append(f"{where}.manifest: Invalid value: {exc}")
        return None
    ref = job.spec.generator_pool
    if ref is None or ref.name != pool or job.spec.model.lora is None:
        problems.append(f"{where}.manifest: Invalid value: job {name!r} must name GeneratorPool {pool!r} "
                        "(spec.generatorPool) and train an adapter (spec.model.lora)")
        return None
    raw = entry.get("peers")
    peers: dict[str, Any] = raw if isinstance(raw, dict) else {}
    parsed = {role: roleenv.parse_peers(",".join(peers.get(role, [])), key=f"{where}.peers.{role}",
                                        problems=problems) for role in ("trainer", "verifier")}
    if not parsed["trainer"]:
        problems.append(f"{where}.peers.trainer: Required value: the job's trainer pods")
    if key is None or not parsed["trainer"]:
        return None
    from kubeforge.runtime import config    # the trainer pods' ranks, as the job's own roles see them

    return Attached(name=name, job=job, key=key, port_base=int(bases[index]),
                    trainers=config.rank_peers(parsed["trainer"], job.spec.roles.trainer.ranks()),
                    verifiers=parsed["verifier"])


def _key(raw: Any) -> bytes | None:
    try:
        key = bytes.fromhex(raw) if isinstance(raw, str) else b""
    except ValueError:
        return None
    return key if len(key) >= roleenv.JOB_KEY_MIN_BYTES else None


def write(path: pathlib.Path, entries: Sequence[Mapping[str, Any]]) -> None:
    """Write a jobs file (the local launcher's side of :func:`read`)."""
    path.write_text(json.dumps({"jobs": list(entries)}, indent=1))


def write_keys(path: pathlib.Path, keys: Mapping[str, bytes]) -> None:
    """Write a keys file readable by its owner only."""
    path.touch(mode=0o600)
    path.write_text(json.dumps({k: v.hex() for k, v in keys.items()}))

