"""What a pool engine knows of the jobs attached to it: two files, named by the env contract.

``KUBEFORGE_POOL_JOBS`` (a ConfigMap on a cluster; written by ``kubeforge run`` locally)::

    {"jobs": [{"name": "job-a", "namespace": "team", "uid": "3f2a...", "manifest": "/run/job-a/rljob.yaml",
               "portBases": [23010],
               "peers": {"trainer": ["127.0.0.1:23020"], "verifier": ["127.0.0.1:23030"]}}]}

``portBases[i]``: where engine ``i`` serves this job (its data port is ``portBase + contract.PORT_DATA``; the job's
``KUBEFORGE_PEERS_GENERATOR`` lists the same ``host:portBase`` entries); ``peers``: the job's trainer pods and
verifiers, as in the job's own env contract (``host:portBase``); ``namespace`` and ``uid``: the job's identity, from
which (with the pool's key) its key is derived.

``KUBEFORGE_POOL_KEY`` (a Secret: ``<pool>-pool-key-<key id>``): the pool's key, 64 hex characters. A job's key is
``kubeforge.api.poolkeys.job_key(pool key, namespace, name, uid)``, the key the operator wrote into the job's own key
Secret: so every job listed has its key, and the engines hold no file a job's key could be missing from.

Role: :func:`read` parses both into :class:`Attached` records for ``generator.pool.start``; bad input is a
:class:`AttachError` with one message per problem, naming the file and the field. :class:`Watch` polls the files'
content (the kubelet swaps the projected folder in place when the operator changes the jobs file) and hands the
new set on when it changed and reads well; a file that does not read well leaves the last good set in place (counted
and logged by the caller). Invariant: every attached job has a key (a pool never serves a job unauthenticated), and
its manifest names this pool and trains an adapter.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubeforge.api import load, poolkeys, rljob, roleenv


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


def read(*, jobs_path: str, key_path: str, pool: str, index: int) -> list[Attached]:
    """The jobs engine ``index`` of ``pool`` serves (see the module docstring)."""
    problems: list[str] = []
    jobs_doc = _json(jobs_path, problems)
    pool_key = _pool_key(key_path, problems)
    if problems:
        raise AttachError(problems)
    assert pool_key is not None
    out = []
    entries = jobs_doc.get("jobs") if isinstance(jobs_doc, dict) else None
    if not isinstance(entries, list):
        raise AttachError([f"{jobs_path}: jobs: Required value: a list of attached jobs"])
    for i, entry in enumerate(entries):
        got = _one(entry, pool_key=pool_key, where=f"{jobs_path}: jobs[{i}]", pool=pool, index=index,
                   problems=problems)
        if got is not None:
            out.append(got)
    names = [a.name for a in out]
    if len(set(names)) != len(names):
        problems.append(f"{jobs_path}: jobs: Duplicate value: a job is attached once")
    if problems:
        raise AttachError(problems)
    return out


def _pool_key(path: str, problems: list[str]) -> bytes | None:
    try:
        text = pathlib.Path(path).read_text().strip()
    except OSError as exc:
        problems.append(f"{path}: cannot be read: {exc}")
        return None
    key = _key(text)
    if key is None:
        problems.append(f"{path}: Invalid value: the pool's key, at least {2 * roleenv.JOB_KEY_MIN_BYTES} hex "
                        "characters (a pool serves no job unauthenticated)")
    return key


def _json(path: str, problems: list[str]) -> Any:
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as exc:
        problems.append(f"{path}: cannot be read as JSON: {exc}")
        return None


def _one(entry: Any, *, pool_key: bytes, where: str, pool: str, index: int,
         problems: list[str]) -> Attached | None:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        problems.append(f"{where}.name: Required value")
        return None
    name = entry["name"]
    identity = [entry.get(k) for k in ("namespace", "uid")]
    if not all(isinstance(v, str) and v for v in identity):
        problems.append(f"{where}: Required value: namespace and uid, the job's identity its key is derived from")
        return None
    key = poolkeys.job_key(pool_key, namespace=str(identity[0]), job=name, uid=str(identity[1]))
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
    if not parsed["trainer"]:
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


def write_key(path: pathlib.Path, key: bytes) -> None:
    """Write a pool's key file (64 hex) readable by its owner only."""
    path.touch(mode=0o600)
    path.write_text(key.hex())


#: How often :class:`Watch` looks at the files by default (the kubelet refreshes them about once a minute).
WATCH_SECONDS = 2.0


@dataclasses.dataclass(kw_only=True)
class Watch:
    """The jobs an engine serves, as the files say now: :meth:`poll` reads the files' content at most every
    ``interval`` seconds and returns the new set when the content changed and reads well (:func:`read`), None
    otherwise. A content that does not read well is counted in ``bad`` (once per distinct content) with its
    problems in ``last_error``; the caller keeps serving the last good set."""

    jobs_path: str
    key_path: str
    pool: str
    index: int
    interval: float = WATCH_SECONDS
    clock: Callable[[], float] = time.monotonic
    bad: int = 0
    last_error: str = ""
    _digest: str = ""
    _next: float = 0.0

    def first(self) -> list[Attached]:
        """The set at start: :func:`read` (an engine that cannot read its files at start does not start)."""
        self._digest = self._content()
        self._next = self.clock() + self.interval
        return read(jobs_path=self.jobs_path, key_path=self.key_path, pool=self.pool, index=self.index)

    def poll(self) -> list[Attached] | None:
        now = self.clock()
        if now < self._next:
            return None
        self._next = now + self.interval
        digest = self._content()
        if digest == self._digest:
            return None
        self._digest = digest
        try:
            return read(jobs_path=self.jobs_path, key_path=self.key_path, pool=self.pool, index=self.index)
        except AttachError as exc:
            self.bad += 1
            self.last_error = str(exc)
            return None

    def _content(self) -> str:
        """A digest of the jobs file, the key file and the manifests the jobs file names (a manifest may change
        while the jobs file does not)."""
        h = hashlib.sha256()
        paths = [self.jobs_path, self.key_path]
        try:
            doc = json.loads(pathlib.Path(self.jobs_path).read_bytes())
            paths += [str(e.get("manifest")) for e in doc.get("jobs") or () if isinstance(e, dict)]
        except (OSError, ValueError, AttributeError, TypeError):
            pass
        for path in paths:
            try:
                h.update(pathlib.Path(path).read_bytes())
            except OSError as exc:
                h.update(f"unreadable {path}: {exc.errno}".encode())
            h.update(b"\x00")
        return h.hexdigest()
