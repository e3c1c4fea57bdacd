"""Role processes of one attempt: start them, watch them, stop them; and the local restart policy.

```
 launcher ──spawn (own session = own process group)──▶ trainer-0 … trainer-T, generator-0 …, verifier-0 …
    │ poll every 0.5 s: exit codes                         │ vLLM's engine-core children share the group
    │ stop: SIGTERM to each group → wait grace → SIGKILL   ▼
```

Invariants:
- Every child leads its own process group (``start_new_session``), so Ctrl-C in the terminal reaches only the
  launcher, and stopping a child kills everything it spawned (vLLM engine processes included): nothing is left
  behind.
- The restart policy is pure (:func:`decide`): a run succeeds when every trainer exits 0; a non-zero exit of any
  role fails the attempt (generators and verifiers exit 0 only on the STOP that follows the last step); a failed attempt restarts the whole job (all roles, trainers resume from their last
  complete checkpoint) while fewer than ``spec.failurePolicy.maxRestarts`` restarts were used, else the run fails.
  Whole-job restarts match what the operator does on a cluster, and re-form the trainers' data-parallel group and
  the weight-sync group from scratch.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcSpec:
    """How to start one role process."""

    name: str                 # role-index
    role: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log: pathlib.Path


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exit:
    name: str
    role: str
    code: int


class Verdict(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RESTART = "restart"
    FAILED = "failed"


def decide(*, exits: Sequence[Exit], trainers: int, restarts: int, max_restarts: int) -> Verdict:
    """The local restart policy (pure): see the module docstring."""
    if any(e.code != 0 for e in exits):
        return Verdict.RESTART if restarts < max_restarts else Verdict.FAILED
    if sum(1 for e in exits if e.role == "trainer") == trainers:
        return Verdict.SUCCEEDED
    return Verdict.RUNNING


def describe(code: int) -> str:
    """``exit code 3`` / ``killed by SIGKILL``."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Group:
    """The processes of one attempt."""

    def __init__(self, specs: Sequence[ProcSpec]) -> None:
        self.specs = list(specs)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._exits: dict[str, Exit] = {}

    def start(self) -> None:
        for spec in self.specs:
            spec.log.parent.mkdir(parents=True, exist_ok=True)
            with spec.log.open("ab") as log:
                self.procs[spec.name] = subprocess.Popen(
                    list(spec.argv), env=dict(spec.env), stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True)

    def poll(self) -> list[Exit]:
        """Every exit seen so far (in the order seen)."""
        for spec in self.specs:
            proc = self.procs.get(spec.name)
            if proc is None or spec.name in self._exits:
                continue
            code = proc.poll()
            if code is not None:
                self._exits[spec.name] = Exit(name=spec.name, role=spec.role, code=code)
        return list(self._exits.values())

    def stop(self, *, grace: float = 10.0) -> None:
        """SIGTERM every process group, wait up to ``grace`` seconds, SIGKILL what is left; reap all."""
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)   # also the group's leftovers (engine-core children)
            proc.wait()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: pathlib.Path, *, lines: int = 25) -> str:
    """The last lines of a log, for the failure message."""
    try:
        text = path.read_bytes()[-20000:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
