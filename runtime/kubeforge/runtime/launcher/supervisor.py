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
- The restart policy is pure (:func:`judge`): a run succeeds when every trainer exits 0; a non-zero exit of any
  role is a failure (generators and verifiers exit 0 only on the STOP that follows the last step), and what it
  restarts is decided by ``kubeforge.api.failures.decide`` from ``spec.failurePolicy`` — the very function the
  operator uses for pods: ``RestartAll`` stops every process and starts a new attempt (trainers resume from their
  last complete checkpoint), ``RestartRole``/``Ignore`` start only the failed processes again in place (same
  ports, same attempt; the trainer keeps running and re-forms the weight-sync group), ``Fail`` ends the run.
- A process restarted in place is a new incarnation of the same name: its old exit is forgotten.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import pathlib
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from kubeforge.api import contract, failures, rljob


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcSpec:
    """How to start one role process."""

    name: str                 # role-index
    role: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log: pathlib.Path
    port_base: int = 0        # the process's first port (its /healthz at + contract.PORT_METRICS); 0: none


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exit:
    name: str
    role: str
    code: int


class Verdict(enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    RESTART = "restart"              # RestartAll: a new attempt of every process
    RESTART_IN_PLACE = "in-place"    # RestartRole / Ignore: only ``Decision.restart`` start again
    FAILED = "failed"


def as_failure(e: Exit) -> failures.Failure:
    code, reason = failures.from_exit(e.code)
    return failures.Failure(role=e.role, name=e.name, exit_code=code, reason=reason)


def judge(*, exits: Sequence[Exit], trainers: int, restarts: int, policy: rljob.FailurePolicySpec,
          unhealthy: Sequence[Exit] = ()) -> tuple[Verdict, failures.Decision | None]:
    """The local restart policy (pure): see the module docstring. ``unhealthy`` are processes the watchdog killed
    for making no progress (reason ``Unhealthy``)."""
    sick = {e.name for e in unhealthy}
    failed = [as_failure(e) for e in exits if e.code != 0 and e.name not in sick]
    failed += [dataclasses.replace(as_failure(e), reason=rljob.FailureReason.UNHEALTHY.value) for e in unhealthy]
    decision = failures.decide(policy, failed, restarts=restarts)
    if decision is None:
        done = sum(1 for e in exits if e.role == "trainer" and e.code == 0) == trainers
        return (Verdict.SUCCEEDED if done else Verdict.RUNNING), None
    verdict = {failures.FAIL: Verdict.FAILED, failures.RESTART_ALL: Verdict.RESTART}.get(
        decision.action, Verdict.RESTART_IN_PLACE)
    return verdict, decision


def split_agents(exits: Sequence[Exit]) -> tuple[list[Exit], list[Exit]]:
    """The role processes' exits (judged by the failure policy) and the agent and sandbox processes' (``spec.agent``,
    ``spec.sandbox``: not roles; restarted in place, never judged, as their pods are by their StatefulSets)."""
    outside = (contract.AGENT, contract.SANDBOX)       # spec.sandbox's processes: the same rule as agents'
    return ([e for e in exits if e.role not in outside], [e for e in exits if e.role in outside])


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
            self._spawn(spec)

    def _spawn(self, spec: ProcSpec) -> None:
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        with spec.log.open("ab") as log:
            self.procs[spec.name] = subprocess.Popen(
                list(spec.argv), env=dict(spec.env), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)

    def restart(self, names: Sequence[str], *, grace: float = 5.0) -> None:
        """Start the named processes again in place (killing what is left of them first); their exits are
        forgotten."""
        by_name = {s.name: s for s in self.specs}
        for name in names:
            proc = self.procs.get(name)
            if proc is not None:
                _stop_one(proc, grace=grace)
            self._exits.pop(name, None)
            self._spawn(by_name[name])

    def kill(self, name: str) -> None:
        """SIGKILL one process's group (the watchdog's verdict on a process that stopped making progress)."""
        proc = self.procs.get(name)
        if proc is not None:
            _signal_group(proc, signal.SIGKILL)

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


class Watchdog:
    """The local liveness probe: asks each process's ``/healthz`` every ``period`` seconds; a 503 (its heartbeat is
    older than ``progressDeadlineSeconds``) gets the process SIGKILLed and its exit judged with reason Unhealthy.
    A process not answering at all is left alone (it may be starting; its exit is seen anyway)."""

    def __init__(self, group: Group, *, period: float = 5.0) -> None:
        self.group, self.period = group, period
        self.killed: set[str] = set()
        self._next = time.monotonic() + period

    def check(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.period
        exited = {e.name for e in self.group.poll()}
        for spec in self.group.specs:
            if spec.name in exited or spec.name in self.killed:
                continue
            if spec.port_base and _health(spec.port_base + contract.PORT_METRICS) == 503:
                self.killed.add(spec.name)
                self.group.kill(spec.name)

    def unhealthy(self, exits: Sequence[Exit]) -> list[Exit]:
        return [e for e in exits if e.name in self.killed]

    def forget(self, names: Sequence[str]) -> None:
        self.killed -= set(names)


def _health(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


def _stop_one(proc: subprocess.Popen[bytes], *, grace: float) -> None:
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _signal_group(proc, signal.SIGKILL)
    proc.wait()


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
